"""Stand-in for vllm/engine/arg_utils.py: engine args taken from the parsed namespace, and the part of
`create_engine_config` that reads only the model's config.json and the scheduler fields.

`from_cli_args` mirrors vLLM 0.33.0 engine/arg_utils.py lines 1972-1980 (copy every namespace attribute that
is an engine field; the stand-in's fields are every parsed dest). `create_engine_config` (lines 2245-…) reads
`<model>/config.json` (an OSError where there is none, as transformers raises), takes max_model_len from it
where the argv sets none (`max_position_embeddings`), then applies `SchedulerConfig.verify_max_model_len`
(vllm/config/scheduler.py lines 317-345, 0.33.0) with vLLM's messages, wrapped as pydantic wraps them
(`1 validation error for SchedulerConfig` / `Value error, …`). Where the argv leaves max_num_batched_tokens or
max_num_seqs to vLLM, the real default depends on the device and usage context (`get_batch_defaults`): the
stand-in does not guess it and skips those rules. Nothing else of the engine config is reproduced.
"""

import json
import os
from types import SimpleNamespace


class ValidationError(ValueError):
    """The shape of pydantic's ValidationError text for a model validator's ValueError."""

    def __init__(self, model, message):
        super().__init__(f"1 validation error for {model}\n  Value error, {message} [type=value_error, "
                         "input_value=ArgsKwargs((), {…}), input_type=ArgsKwargs]")


def _int(value):
    return None if value in (None, "", "None") else int(value)


class EngineArgs:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    @classmethod
    def from_cli_args(cls, args):
        return cls(**vars(args))

    def create_engine_config(self, usage_context=None, headless=False):
        with open(os.path.join(self.model, "config.json"), encoding="utf-8") as handle:
            hf_config = json.load(handle)
        max_model_len = _int(getattr(self, "max_model_len", None)) or hf_config.get("max_position_embeddings")
        budget = _int(getattr(self, "max_num_batched_tokens", None))
        seqs = _int(getattr(self, "max_num_seqs", None))
        chunked = getattr(self, "enable_chunked_prefill", None)
        chunked = True if chunked is None else chunked  # SchedulerConfig.enable_chunked_prefill: bool = True
        active = _int(getattr(self, "max_num_active_seqs", None))
        if budget is not None and max_model_len is not None and budget < max_model_len and not chunked:
            raise ValidationError("SchedulerConfig", (
                f"max_num_batched_tokens ({budget}) is "
                f"smaller than max_model_len ({max_model_len}). "
                "This effectively limits the maximum sequence length to "
                "max_num_batched_tokens and makes vLLM reject longer "
                "sequences. Please increase max_num_batched_tokens or "
                "decrease max_model_len."))
        if budget is not None and seqs is not None and budget < seqs:
            raise ValidationError("SchedulerConfig", (
                f"max_num_batched_tokens ({budget}) must "
                "be greater than or equal to max_num_seqs "
                f"({seqs})."))
        if active is not None and seqs is not None and active > seqs:
            raise ValidationError("SchedulerConfig", (
                f"max_num_active_seqs ({active}) cannot be "
                f"greater than max_num_seqs ({seqs})."))
        scheduler = SimpleNamespace(max_num_batched_tokens=budget, max_num_seqs=seqs, enable_chunked_prefill=chunked)
        return SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len), scheduler_config=scheduler)


class AsyncEngineArgs(EngineArgs):
    pass
