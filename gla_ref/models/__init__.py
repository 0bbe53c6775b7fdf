"""Language models: FLA's GLA causal LM, as a drop-in for FLA 0.6.0's ``fla.models``.

Importing this package loads no framework. Import what you use:

* :mod:`gla_ref.models.config` — :class:`~gla_ref.models.config.GLAConfig`, FLA's config (its fields,
  defaults and JSON), without a framework;
* :mod:`gla_ref.models.torch` — ``GLAForCausalLM``, ``GLAModel``, ``GLABlock`` in PyTorch: FLA's structure
  and parameter names (its checkpoints load as they are), loss, ``generate()`` with the recurrent cache;
* :mod:`gla_ref.models.generation`, :mod:`gla_ref.models.checkpoint` — generation and checkpoint files.
"""
