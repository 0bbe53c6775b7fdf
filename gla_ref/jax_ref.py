"""``gla_ref.jax_ref``, the name readers import: the module :mod:`gla_ref.reference.jax` itself."""

import sys

from gla_ref.reference import jax as reference_module

sys.modules[__name__] = reference_module
