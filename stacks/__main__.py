import sys

from stacks.cli import main

sys.exit(main())
