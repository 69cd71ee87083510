"""Stand-in for Ray inside the test image: only its version, for the workers' import check."""

__version__ = "2.60.0"
