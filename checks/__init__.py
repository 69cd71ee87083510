"""Verification programs: each has a `main()`, `--json`, and exits 0 pass / 1 fail / 2 cannot run.

Programs that run on a GPU host (preflight, nccl_transport, engines, ray_cluster) use only Python's standard
library plus `checks.verdict`, so `checks.bundle` can ship them over SSH as one self-contained script.

Two local servers for trying the checks by hand (docs/checks-by-hand.md), never shipped to a node: `standin`
(answers like vLLM's OpenAI API, with DP ranks and faults) and `local_s3` (moto's S3 with a tiny model).
"""
