"""Triton kernels (GPU; tested on CPU under TRITON_INTERPRET=1). Import lazily: CPU paths never need Triton."""
