"""Stand-in for vllm/utils/argparse_utils.py: only the parser class the image-card probe builds the CLI with.

vLLM 0.33.0's `FlexibleArgumentParser` (lines 156-…) also normalises `_` to `-`, merges dotted JSON arguments and
reads `--config` files; the stand-in's parser is plain argparse, and the probe only reads its registered actions.
"""

import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    pass
