"""Stand-in for vllm/engine/arg_utils.py: engine args taken from the parsed namespace; no engine config.

`from_cli_args` mirrors vLLM 0.33.0 engine/arg_utils.py lines 1972-1980 (copy every namespace attribute that
is an engine field; the stand-in's fields are every parsed dest). `create_engine_config` needs the model and
a device in the real package; here it refuses, and the dry run (checks/vllm_args.py) replaces it, as it does
in the real vLLM.
"""


class EngineArgs:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    @classmethod
    def from_cli_args(cls, args):
        return cls(**vars(args))

    def create_engine_config(self, usage_context=None, headless=False):
        raise RuntimeError("the vLLM stand-in cannot build an engine config (no model, no device)")


class AsyncEngineArgs(EngineArgs):
    pass
