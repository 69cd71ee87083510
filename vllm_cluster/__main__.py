"""`python -m vllm_cluster …`: the same as the `vllm-cluster` command."""

import sys

from vllm_cluster.cli import main

sys.exit(main())
