"""Every Triton kernel against a plain torch reference, at small shapes, under Triton's
interpreter (``TRITON_INTERPRET=1``, set by this folder's conftest): random inputs, custom
masks with rows that see nothing, odd page counts and partial last pages, GQA groups that are
not powers of two, head sizes that need padding, sliding windows, soft-capping, fp32 and bf16.

(The sampling and logit-mask kernels are checked against ``pie_core.backend_kit.sampling`` in
``test_torch_sampling.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # xgrammar brings it to every install

from pie_backend_torch.triton_kernels.ops import plan_tiles, tile_block_m  # noqa: E402
from pie_backend_torch.triton_kernels.paged_attention import paged_attention  # noqa: E402
from pie_backend_torch.triton_kernels.rope_kv import rope_and_write_kv  # noqa: E402

PAGE = 3


def _requests(rng: np.random.Generator, num_pages: int):
    """(n_tokens, kv_len, pages, custom mask or None) per request: odd page counts, partial pages."""
    out = []
    free = list(rng.permutation(num_pages))
    for n, kv_len, masked in [(1, 1, False), (1, 10, False), (5, 5, False), (4, 11, True), (1, 7, True), (6, 14, False)]:
        pages = [int(free.pop()) for _ in range(-(-kv_len // PAGE))]
        mask = None
        if masked:
            mask = rng.random((n, kv_len)) < 0.5
            mask[0] = False  # sees nothing
        out.append((n, kv_len, pages, mask))
    return out


def _reference(q, ks, vs, pos, reqs, writes, positions, window, softcap):
    """Dense per-request attention in float64."""
    heads, kvh = q.shape[1], ks.shape[0]
    group = heads // kvh
    out = torch.zeros(q.shape, dtype=torch.float64)
    t = 0
    for n, kv_len, pages, mask in reqs:
        slots = (torch.tensor(pages)[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)[:kv_len]
        k = ks[:, slots].double().repeat_interleave(group, 0)  # [heads, L, d]
        v = vs[:, slots].double().repeat_interleave(group, 0)
        qq = q[t : t + n].double().transpose(0, 1)  # [heads, n, d]
        scores = qq @ k.transpose(1, 2)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if mask is not None:
            allowed = torch.from_numpy(mask)
        else:
            allowed = torch.arange(kv_len)[None, :] <= writes[t : t + n, None]
        if window is not None:
            allowed = allowed & (pos[slots][None, :] > positions[t : t + n, None] - window)
        scores = scores.masked_fill(~allowed, float("-inf"))
        w = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        out[t : t + n] = (w @ v).transpose(0, 1)
        t += n
    return out


@pytest.mark.parametrize(
    "heads, kv_heads, d, window, softcap, dtype",
    [
        (4, 2, 16, None, None, torch.float32),
        (6, 2, 24, None, None, torch.float32),  # group 3 (padded to 4), head_dim 24 (padded to 32)
        (5, 1, 16, 4, None, torch.float32),  # sliding window
        (4, 4, 8, None, 2.5, torch.float32),  # soft-capping, no grouping
        (8, 2, 16, 5, None, torch.bfloat16),
    ],
)
def test_paged_attention_matches_dense_attention(heads, kv_heads, d, window, softcap, dtype):
    rng = np.random.default_rng(heads * 7 + d)
    num_pages = 40
    reqs = _requests(rng, num_pages)
    torch.manual_seed(0)
    ks = torch.randn(kv_heads, num_pages * PAGE, d).to(dtype)
    vs = torch.randn(kv_heads, num_pages * PAGE, d).to(dtype)
    pos = torch.from_numpy(rng.permutation(num_pages * PAGE).astype(np.int32) % 17)
    n_tok = [r[0] for r in reqs]
    q = (torch.randn(sum(n_tok), heads, d) * d**-0.5).to(dtype)
    qo = np.concatenate([[0], np.cumsum(n_tok)]).astype(np.int32)
    writes = torch.cat([torch.arange(kv - n, kv) for n, kv, _, _ in reqs]).to(torch.int32)
    positions = torch.from_numpy(rng.integers(0, 20, len(writes)).astype(np.int32))
    masks = [m for _, _, _, m in reqs]
    sizes = [0 if m is None else m.size for m in masks]
    mask_data = np.concatenate([m.reshape(-1) for m in masks if m is not None]).astype(np.uint8)
    block_m = tile_block_m(heads // kv_heads, max(n_tok))
    tile_req, tile_start = plan_tiles(qo, block_m)
    got = paged_attention(
        q, ks, vs, pos,
        torch.from_numpy(tile_req), torch.from_numpy(tile_start), block_m,
        torch.from_numpy(qo),
        torch.from_numpy(np.concatenate([[0], np.cumsum([len(r[2]) for r in reqs])]).astype(np.int32)),
        torch.tensor([p for r in reqs for p in r[2]], dtype=torch.int32),
        torch.tensor([r[1] for r in reqs], dtype=torch.int32),
        writes, positions,
        torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)),
        torch.from_numpy(mask_data),
        PAGE, window=window, softcap=softcap, block_n=16,
    )
    want = _reference(q, ks, vs, pos, reqs, writes, positions, window, softcap).reshape(len(writes), -1)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    blind = torch.from_numpy(np.concatenate([np.zeros(n, bool) if m is None else ~m.any(1) for n, _, _, m in reqs]))
    assert (got[blind] == 0).all()


def test_tiles_cover_every_token_once():
    qo = np.array([0, 1, 9, 10, 30], dtype=np.int32)
    req, start = plan_tiles(qo, 4)
    covered = np.concatenate([np.arange(s, min(s + 4, qo[r + 1])) for r, s in zip(req, start)])
    np.testing.assert_array_equal(covered, np.arange(30))
    assert tile_block_m(7, 1) * 8 >= 16 and tile_block_m(1, 50) >= 16


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv_write_matches_torch(qk_norm, dtype):
    torch.manual_seed(1)
    n, heads, kvh, d = 5, 6, 2, 24
    qkv = torch.randn(n, (heads + 2 * kvh) * d).to(dtype)
    angles = torch.rand(n, d // 2, dtype=torch.float64) * 50
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    ks = torch.zeros(kvh, 30, d, dtype=dtype)
    vs = torch.zeros(kvh, 30, d, dtype=dtype)
    index = torch.tensor([29, 0, 13, 4, 5])
    qn = torch.rand(d) + 0.5 if qk_norm else None
    kn = torch.rand(d) + 0.5 if qk_norm else None
    q = rope_and_write_kv(qkv, cos, sin, ks, vs, index, heads, kvh, 0.25, qn, kn, 1e-6)

    x = qkv.double().view(n, heads + 2 * kvh, d)
    qk = x[:, : heads + kvh]
    if qk_norm:
        rms = torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + 1e-6)
        w = torch.cat([qn.double().expand(heads, d), kn.double().expand(kvh, d)])
        qk = qk * rms * w
    x1, x2 = qk[..., : d // 2], qk[..., d // 2 :]
    c, s = cos.double()[:, None], sin.double()[:, None]
    rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(q.double(), rot[:, :heads] * 0.25, atol=tol, rtol=tol)
    torch.testing.assert_close(ks[:, index].transpose(0, 1).double(), rot[:, heads:], atol=tol, rtol=tol)
    torch.testing.assert_close(vs[:, index].transpose(0, 1).double(), x[:, heads + kvh :], atol=0, rtol=0)
    untouched = torch.ones(30, dtype=torch.bool)
    untouched[index] = False
    assert (ks[:, untouched] == 0).all() and (vs[:, untouched] == 0).all()
