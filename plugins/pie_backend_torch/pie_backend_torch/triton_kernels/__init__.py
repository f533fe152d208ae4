"""Triton kernels of the CUDA path: paged attention (prefill, custom masks, decode), fused
Q/K-norm + RoPE + KV write, and sampling with logit masks.

Importing this package needs ``triton``. The kernels run on CUDA devices; with
``TRITON_INTERPRET=1`` (set before the import) they run on CPU tensors through Triton's
interpreter, which is how the tests check them against plain torch without a GPU.
"""

from pie_backend_torch.triton_kernels.paged_attention import paged_attention
from pie_backend_torch.triton_kernels.rope_kv import rope_and_write_kv
from pie_backend_torch.triton_kernels.sampling import apply_packed_mask, triton_draw

__all__ = ["paged_attention", "rope_and_write_kv", "apply_packed_mask", "triton_draw"]
