"""Llama as torchtitan writes it (gh_titan); SPEC in gh_titan.llama.spec."""


def __getattr__(name):
    if name == "SPEC":
        from gh_titan.llama.spec import SPEC
        return SPEC
    raise AttributeError(name)
