"""Qwen3 as torchtitan writes it (gh_titan); SPEC in gh_titan.qwen3.spec."""


def __getattr__(name):
    if name == "SPEC":
        from gh_titan.qwen3.spec import SPEC
        return SPEC
    raise AttributeError(name)
