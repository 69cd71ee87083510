"""Stand-in for vllm.reasoning: the registered names of the real 0.33.0 registry (captured fixture).

`list_registered` mirrors vLLM 0.33.0 reasoning/abs_reasoning_parsers.py lines 261-263 and
`get_reasoning_parser` its lookup and KeyError (lines 239-258); the stand-in returns the name, not a class.
"""

import vllm


class ReasoningParserManager:
    @classmethod
    def list_registered(cls):
        return sorted(vllm._fixture("_registries.json", "VLLM_STANDIN_REGISTRIES")["reasoning_parsers"])

    @classmethod
    def get_reasoning_parser(cls, name):
        if name in cls.list_registered():
            return name
        registered = ", ".join(cls.list_registered())
        raise KeyError(f"Reasoning parser '{name}' not found. Available parsers: {registered}")

    @classmethod
    def import_reasoning_parser(cls, plugin_path):
        raise NotImplementedError("the vLLM stand-in does not load parser plugins")
