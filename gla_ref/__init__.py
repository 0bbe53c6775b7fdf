"""gla_ref: reference forms and kernels for Gated Linear Attention (GLA).

Importing the package is cheap: it loads no framework. Import the part you need:
``gla_ref.reference.torch``, ``gla_ref.reference.jax``, ``gla_ref.triton``, ``gla_ref.pallas``.
"""

__version__ = "0.1.0"
