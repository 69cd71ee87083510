"""A lab cluster on one machine: nodes that the real Pulumi CLI deploys onto as it would onto servers
(lab/hosts.py; `python -m lab up|down|status`)."""
