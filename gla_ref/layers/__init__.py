"""GLA layers: the GLA paper's layer (§4.4) and the simple-GLA layer of the Pallas RFC.

Importing this package loads no framework. Import the one you use:

* :mod:`gla_ref.layers.torch` — PyTorch ``nn.Module`` s on :mod:`gla_ref.reference.torch` and the
  Triton kernels of :mod:`gla_ref.triton`: ``GatedLinearAttention``, ``SimpleGatedLinearAttention``,
  ``GroupRMSNorm``, and a tiny language model (``GLABlock``, ``GLALM``).
* :mod:`gla_ref.layers.flax` — the same two layers in Flax NNX on :mod:`gla_ref.reference.jax` and the
  Pallas kernels of :mod:`gla_ref.pallas`, with the same parameter names and shapes, so one set
  of weights runs in both.
* :mod:`gla_ref.layers.config` — what both share without a framework: argument checks, sizes,
  the parameter-count formulas, FLA's constructor defaults and the checks of FLA's settings and names.
* :mod:`gla_ref.layers.cache` — FLA's decoding cache (``past_key_values``), without a framework.
* :mod:`gla_ref.layers.fla_torch` — FLA's interface in PyTorch: padding masks, cache layouts,
  activations, the ``"auto"`` backend, FLA's forward and weights of the GLA layer.
* :mod:`gla_ref.layers.short_conv` — FLA's short convolution in PyTorch.

FLA's whole language model (config, checkpoints, loss, ``generate()``) is :mod:`gla_ref.models`.
"""
