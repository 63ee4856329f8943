"""Framework shims: a framework's own model spec, presented as a Gatehouse
:class:`~gatehouse_adapter.ModelSpec` (contract v1), so that a model written for the framework
runs under the gates as it is.

* :mod:`gatehouse_adapter.frameworks.archon` -- AReaL's Archon (``ModelSpec(model_class,
  model_args_class, state_dict_adapter_class, parallelize_fn, supported_model_types)``, args
  from a transformers config object, a forward that requires ``cu_seqlens``).
* :mod:`gatehouse_adapter.frameworks.torchtitan` -- torchtitan's ``TrainSpec`` (``model_cls``,
  ``model_args``, ``state_dict_adapter``, ``parallelize_fn``; ``forward(tokens)`` with optional
  ``positions``, no ``cu_seqlens``).

Each takes the framework's object and a :class:`~gatehouse_adapter.Fields` declaration (what the
port computes of config.json, which the framework's code does not say) and maps:

config     config.json (a dict) -> the declared checks (ValueError naming field and value) ->
           ``transformers.AutoConfig.for_model(**config)`` -> the framework's args;
forward    the contract's (tokens, positions, cu_seqlens, max_seqlen) -> the framework's call;
weights    the framework's adapter, held to contract v1's coverage (no key dropped or invented,
           the tied alias verified);
tying      the framework's tie flag (``enable_weight_tying``) checked against
           ``tie_word_embeddings``, the output projection tied to the embedding;
parallel   Gatehouse's 1-D tp mesh -> the framework's ParallelDims (tp only) and its
           parallelize_fn, tied weights checked afterwards.

They import transformers when a config is read (it is in the worker's environment, beside torch).
See docs/frameworks.md.
"""

__all__ = ["archon", "torchtitan"]
