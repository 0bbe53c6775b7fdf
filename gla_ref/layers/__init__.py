"""GLA layers: the GLA paper's layer (§4.4) and the simple-GLA layer of the Pallas RFC.

Importing this package loads no framework. Import the one you use:

* :mod:`gla_ref.layers.torch` — PyTorch ``nn.Module`` s on :mod:`gla_ref.reference.torch` and the
  Triton kernels of :mod:`gla_ref.triton`: ``GatedLinearAttention``, ``SimpleGatedLinearAttention``,
  ``GroupRMSNorm``, and a tiny language model (``GLABlock``, ``GLALM``).
* :mod:`gla_ref.layers.flax` — the same two layers in Flax NNX on :mod:`gla_ref.reference.jax` and the
  Pallas kernels of :mod:`gla_ref.pallas`, with the same parameter names and shapes, so one set
  of weights runs in both.
* :mod:`gla_ref.layers.config` — what both share without a framework: argument checks, sizes,
  the parameter-count formulas and the renaming of FLA's parameter names.
"""
