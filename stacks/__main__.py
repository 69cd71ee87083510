import sys

from review.cli import main

# SIGPIPE stays ignored (Python's default): a probe that exits without reading its stdin must give a refusal, not
# kill this process silently; a reader that closes our stdout (`| head`) is handled in review.cli.main.
sys.exit(main())
