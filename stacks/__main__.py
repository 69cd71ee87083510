import signal
import sys

from review.cli import main

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `python -m stacks plan prod | head` ends quietly
sys.exit(main())
