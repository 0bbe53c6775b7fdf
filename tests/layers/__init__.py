"""The GLA layers (gla_ref.layers, PyTorch and Flax), their short convolutions and the MQAR task."""
