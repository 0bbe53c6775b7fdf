"""``gla_ref.torch_ref``, the name readers import: the module :mod:`gla_ref.reference.torch` itself."""

import sys

from gla_ref.reference import torch as reference_module

sys.modules[__name__] = reference_module
