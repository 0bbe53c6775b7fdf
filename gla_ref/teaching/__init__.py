"""Teaching kernels: the first Triton and Pallas kernels and the historical five-kernel pipeline.

Tested like the rest of the library and shown in chapters 4 and 5; never used by the production paths.
Importing this package loads no framework.
"""
