"""Stand-in for vllm.tool_parsers: the registered names of the real 0.33.0 registry (captured fixture).

`list_registered` mirrors vLLM 0.33.0 tool_parsers/abstract_tool_parser.py lines 373-375.
"""

import vllm


class ToolParserManager:
    @classmethod
    def list_registered(cls):
        return sorted(vllm._fixture("_registries.json", "VLLM_STANDIN_REGISTRIES")["tool_parsers"])
