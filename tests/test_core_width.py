"""Width growth (`core.width`): on the project's GPT, a nanoGPT written here (tied and untied),
Hugging Face GPT-2 and Llama (tied and untied, grouped-query attention) built from tiny configs,
the logits at birth equal the old ones within 1e-5, the widened model is the natively wider one
(its parameter shapes, and bitwise its logits with the same weights), every new entry trains,
the stream's copies get different gradients from the first step and drift apart, cloned heads
and units (``new_units="clone"``) are their sources' copies and part from them, the optimizer's
state follows, the configs follow (a Hugging Face round trip), the FLOP meter counts the new
cost, and what cannot be widened is refused in one line."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2DoubleHeadsModel,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from esper_lightning.core.depth import DepthGrowth, grow
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.slots import SeedSlot
from esper_lightning.core.width import LAYOUTS, BlockLayout, WidthGrowth, check_widen, widen
from esper_lightning.hosts.gpt import GPTHost
from esper_lightning.hosts.presets import GPTConfig

VOCAB, BLOCK, WIDTH, HEADS, UNITS = 64, 16, 16, 2, 32


# --- a nanoGPT as its users write it (Karpathy's names, a dataclass config) ---------------------
@dataclass
class NanoConfig:
    vocab_size: int = VOCAB
    block_size: int = BLOCK
    n_layer: int = 2
    n_head: int = HEADS
    n_embd: int = WIDTH
    bias: bool = True
    tied: bool = True


class NanoLayerNorm(nn.Module):
    """nanoGPT's LayerNorm (an optional bias), a class of its own."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoAttention(nn.Module):
    def __init__(self, config: NanoConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class NanoBlock(nn.Module):
    def __init__(self, config: NanoConfig) -> None:
        super().__init__()
        self.ln_1 = NanoLayerNorm(config.n_embd, config.bias)
        self.attn = NanoAttention(config)
        self.ln_2 = NanoLayerNorm(config.n_embd, config.bias)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.mlp.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, config: NanoConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList(NanoBlock(config) for _ in range(config.n_layer)),
            ln_f=NanoLayerNorm(config.n_embd, config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tied:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --- the hosts, each buildable natively at k times the width ------------------------------------
def build(kind: str, factor: int = 1, mlp: int | None = None, rng_seed: int = 0) -> nn.Module:
    """``kind`` with its width, heads (and key-value heads) times ``factor`` and its MLP times
    ``mlp`` (default ``factor``), initialised from ``rng_seed``, in eval mode."""
    torch.manual_seed(rng_seed)
    j = factor if mlp is None else mlp
    d, n = WIDTH * factor, HEADS * factor
    if kind == "gpthost":
        return GPTHost(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=n,
                                 n_embd=d)).eval()
    if kind.startswith("nanogpt"):
        return NanoGPT(NanoConfig(n_head=n, n_embd=d, tied=kind == "nanogpt")).eval()
    tied = kind in ("gpt2", "llama-tied")
    if kind.startswith("gpt2"):
        return GPT2LMHeadModel(GPT2Config(
            n_layer=2, n_embd=d, n_head=n, n_inner=4 * WIDTH * j if mlp else None,
            vocab_size=VOCAB, n_positions=BLOCK, bos_token_id=0, eos_token_id=0,
            tie_word_embeddings=tied)).eval()
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=d, intermediate_size=UNITS * j, num_hidden_layers=2, num_attention_heads=2 * n,
        num_key_value_heads=n, head_dim=WIDTH // (2 * HEADS), vocab_size=VOCAB,
        max_position_embeddings=BLOCK, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=tied)).eval()


KINDS = ["gpthost", "nanogpt", "nanogpt-untied", "gpt2", "gpt2-untied", "llama", "llama-tied"]
HF = [k for k in KINDS if k.startswith(("gpt2", "llama"))]


def logits(model: nn.Module, idx: Tensor) -> Tensor:
    out = model(idx)
    return out.logits if hasattr(out, "logits") else out


def tokens(shape: tuple[int, ...], rng_seed: int) -> Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(rng_seed))


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if isinstance(v, Tensor)}


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# --- function at birth, and the natively wider model -------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("factor", [2, 3])
@pytest.mark.parametrize("new_units", ["random", "clone"])
def test_widening_keeps_the_logits_and_is_the_natively_wider_model(kind, factor, new_units):
    model = build(kind, rng_seed=1)
    idx = tokens((2, 12), rng_seed=2)
    with torch.no_grad():
        before = logits(model, idx)
    result = widen(model, WidthGrowth(factor=factor, rng_seed=3, new_units=new_units))
    assert result.hidden == (WIDTH, WIDTH * factor)
    if new_units == "clone":  # every entry has a source
        assert not any(mask.any() for mask in result.fresh.values())
    with torch.no_grad():
        after = logits(model, idx)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    native = build(kind, factor, rng_seed=4)
    assert shapes(model) == shapes(native)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in
                                                             native.parameters())
    native.load_state_dict(model.state_dict())  # its own sizes, heads and config agree
    with torch.no_grad():
        assert torch.equal(logits(native, idx), after)


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-untied", "llama", "llama-tied"])
def test_mlp_only_widening_keeps_the_logits_and_the_stream(kind):
    model = build(kind, rng_seed=5)
    idx = tokens((2, 12), rng_seed=6)
    with torch.no_grad():
        before = logits(model, idx)
    result = widen(model, WidthGrowth(factor=1, mlp=2))
    assert result.hidden == (WIDTH, WIDTH) and result.mlp[1] == 2 * result.mlp[0]
    with torch.no_grad():
        torch.testing.assert_close(logits(model, idx), before, rtol=0, atol=1e-5)
    native = build(kind, 1, mlp=2, rng_seed=7)
    assert shapes(model) == shapes(native)
    native.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(logits(native, idx), logits(model, idx))
    # the attention and the stream did not change: only the MLP's parameters grew
    assert all(".mlp." in name for name in result.fresh)


def test_the_stream_is_duplicated_bitwise_and_each_copy_is_the_old_stream():
    model = build("gpthost", rng_seed=8)
    idx = tokens((2, 12), rng_seed=9)
    seen: list[Tensor] = []
    hook = model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(idx)
        widen(model, WidthGrowth(factor=2))
        model(idx)
    hook.remove()
    old, new = seen
    assert torch.equal(new, torch.cat([old, old], dim=-1))


def test_a_tied_head_scales_the_final_norm_by_one_over_k():
    model = build("gpt2", rng_seed=10)
    gain = model.transformer.ln_f.weight.detach().clone()
    widen(model, WidthGrowth(factor=2))
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    torch.testing.assert_close(model.transformer.ln_f.weight.detach(),
                               torch.cat([gain, gain]) / 2, rtol=0, atol=0)
    untied = build("gpt2-untied", rng_seed=10)
    widen(untied, WidthGrowth(factor=2))
    assert torch.equal(untied.transformer.ln_f.weight.detach(), torch.cat([gain, gain]))


def test_attention_grows_more_heads_of_the_same_width():
    model = build("llama", rng_seed=11)
    head_dim = model.config.head_dim
    widen(model, WidthGrowth(factor=2))
    config = model.config
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (
        2 * WIDTH, 4 * HEADS, 2 * HEADS)
    assert config.head_dim == head_dim == model.model.layers[0].self_attn.head_dim
    attention = model.model.layers[0].self_attn
    assert attention.num_key_value_groups == config.num_attention_heads // (
        config.num_key_value_heads)
    # old query rows first, new ones after; the new heads' output columns are zero
    o_proj = attention.o_proj.weight.detach()
    assert not o_proj[:, HEADS * 2 * head_dim:].any()


# --- symmetry broken: the copies learn apart ------------------------------------------------------
def _step(model: nn.Module, optimizer: torch.optim.Optimizer, rng_seed: int) -> None:
    idx, targets = tokens((4, 12), rng_seed), tokens((4, 12), rng_seed + 1)
    optimizer.zero_grad()
    F.cross_entropy(logits(model, idx).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()


def _copies(weight: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    first, second = weight.detach().chunk(2, dim=dim)
    return first, second


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_random_split_gives_the_copies_different_gradients_at_once(kind):
    grads = {}
    for split in ("random", "even"):
        model = build(kind, rng_seed=12)  # eval: dropout would draw each copy its own mask
        widen(model, WidthGrowth(factor=2, split=split))
        idx, targets = tokens((4, 12), rng_seed=13), tokens((4, 12), rng_seed=14)
        F.cross_entropy(logits(model, idx).flatten(0, 1), targets.flatten()).backward()
        table = model.get_input_embeddings().weight.grad
        grads[split] = _copies(table, dim=1)
    first, second = grads["random"]
    assert (first - second).abs().max() > 1e-3 * first.abs().max()
    # An even split gives both copies the same gradient: the new heads and units, whose
    # outgoing weights are zero, do not reach the stream yet.
    first, second = grads["even"]
    torch.testing.assert_close(first, second, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["gpthost", "llama"])
def test_the_copies_diverge_after_a_few_steps(kind):
    model = build(kind, rng_seed=15).train()
    widen(model, WidthGrowth(factor=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for step in range(3):
        _step(model, optimizer, rng_seed=16 + 2 * step)
    block = model.blocks[0] if kind == "gpthost" else model.model.layers[0]
    norm = block.ln_1 if kind == "gpthost" else block.input_layernorm
    writer = block.attn.c_proj if kind == "gpthost" else block.self_attn.o_proj
    table = model.get_input_embeddings() if kind == "llama" else model.tok_emb
    for name, (first, second) in {"norm gain": _copies(norm.weight, 0),
                                  "attention output rows": _copies(writer.weight, 0),
                                  "token table columns": _copies(table.weight, 1)}.items():
        assert (first - second).abs().max() > 1e-3, name


@pytest.mark.parametrize("kind", ["gpthost", "nanogpt-untied", "gpt2", "llama"])
def test_every_new_entry_trains(kind):
    model = build(kind, rng_seed=17).train()
    result = widen(model, WidthGrowth(factor=2))
    params = dict(model.named_parameters())
    before = {name: params[name].detach().clone() for name in result.fresh}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    _step(model, optimizer, rng_seed=18)
    # at the first step every widened tensor has gradient (a new head's incoming rows wait for
    # their output columns, zero at birth, to move)
    assert all(params[name].grad is not None and params[name].grad.any() for name in before)
    for step in range(2):
        _step(model, optimizer, rng_seed=19 + 2 * step)
    for name, old in before.items():
        new = result.fresh[name]
        assert not torch.equal(params[name].detach(), old), name
        if new.any():
            assert (params[name].detach() != old)[new].all(), name


def test_new_heads_and_units_are_random_in_and_zero_out():
    model = build("gpthost", rng_seed=20)
    result = widen(model, WidthGrowth(factor=2, init_std=0.5))
    block = model.blocks[0]
    grown = result.fresh["blocks.0.mlp.c_fc.weight"]
    assert grown.shape == (8 * WIDTH, 2 * WIDTH) and grown[4 * WIDTH:].all()
    assert not grown[:4 * WIDTH].any()
    incoming = block.mlp.c_fc.weight.detach()[4 * WIDTH:]
    assert 0.4 < float(incoming.std()) < 0.6  # init_std
    assert not block.mlp.c_fc.bias.detach()[4 * WIDTH:].any()
    assert not block.mlp.c_proj.weight.detach()[:, 4 * WIDTH:].any()
    # a fused q|k|v grows in each part: rows [old q, new q, old k, new k, old v, new v]
    qkv = result.fresh["blocks.0.attn.c_attn.weight"][:, 0]
    assert qkv.tolist() == ([False] * WIDTH + [True] * WIDTH) * 3


# --- cloned heads and units ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize(("factor", "mlp"), [(1, 2), (2, 3)])
def test_cloned_mlp_units_keep_the_logits(kind, factor, mlp):
    model = build(kind, rng_seed=63)
    idx = tokens((2, 12), rng_seed=64)
    with torch.no_grad():
        before = logits(model, idx)
    widen(model, WidthGrowth(factor=factor, mlp=mlp, new_units="clone"))
    with torch.no_grad():
        torch.testing.assert_close(logits(model, idx), before, rtol=0, atol=1e-5)
    assert shapes(model) == shapes(build(kind, factor, mlp=mlp))


def test_cloned_query_heads_read_the_clones_of_their_key_value_heads():
    model = build("llama", rng_seed=71)  # grouped-query: two query heads per key-value head
    attention = model.model.layers[0].self_attn
    o_proj = attention.o_proj.weight.detach().clone()
    widen(model, WidthGrowth(factor=2, new_units="clone"))
    # [old heads, their clones] in q, k and v alike, so query head n + i reads key-value head
    # n_kv + i // group: the clone of the one query head i reads
    for layer in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert torch.equal(*_copies(layer.weight, 0))
    o_new = attention.o_proj.weight.detach()
    half = o_new.shape[1] // 2
    for rows in (slice(0, WIDTH), slice(WIDTH, 2 * WIDTH)):
        torch.testing.assert_close(o_new[rows, :half] + o_new[rows, half:], o_proj, rtol=0,
                                   atol=1e-6)


def test_a_clone_repeats_its_sources_rows_and_splits_its_outgoing_column():
    model = build("gpthost", rng_seed=65)
    block = model.blocks[0]
    c_fc, c_proj = block.mlp.c_fc.weight.detach().clone(), block.mlp.c_proj.weight.detach().clone()
    c_attn, out = block.attn.c_attn.weight.detach().clone(), block.attn.c_proj.weight.detach()
    out = out.clone()
    widen(model, WidthGrowth(factor=2, new_units="clone", rng_seed=66))
    d, m = WIDTH, 4 * WIDTH
    fc, proj = block.mlp.c_fc.weight.detach(), block.mlp.c_proj.weight.detach()
    assert torch.equal(fc[m:], fc[:m]) and torch.equal(block.mlp.c_fc.bias[m:],
                                                       block.mlp.c_fc.bias[:m])
    # the incoming row reads both stream copies, split: the two halves sum to the old row
    torch.testing.assert_close(fc[:m, :d] + fc[:m, d:], c_fc, rtol=0, atol=1e-6)
    # each stream copy's row of the outgoing matrix: the source's and its clone's columns sum
    # to the old column, split unevenly
    for rows in (slice(0, d), slice(d, 2 * d)):
        torch.testing.assert_close(proj[rows, :m] + proj[rows, m:], c_proj, rtol=0, atol=1e-6)
    assert not torch.allclose(proj[:d, :m], proj[:d, m:])
    # a fused q|k|v: each part's new heads are its old heads again, [q, q', k, k', v, v']
    qkv = block.attn.c_attn.weight.detach()
    for part in range(3):
        new = qkv[2 * d * part:2 * d * (part + 1)]
        assert torch.equal(new[:d], new[d:])
        torch.testing.assert_close(new[:d, :d] + new[:d, d:], c_attn[d * part:d * (part + 1)],
                                   rtol=0, atol=1e-6)
    attn_out = block.attn.c_proj.weight.detach()
    torch.testing.assert_close(attn_out[:d, :d] + attn_out[:d, d:], out, rtol=0, atol=1e-6)


def _clone_gaps(kind: str, split: str) -> list[float]:
    """The largest gap between an MLP unit's incoming row and its clone's after each of four
    AdamW steps."""
    model = build(kind, rng_seed=67).train()
    widen(model, WidthGrowth(factor=2, new_units="clone", split=split))
    block = model.blocks[0] if kind == "gpthost" else model.model.layers[0]
    incoming = block.mlp.c_fc if kind == "gpthost" else block.mlp.up_proj
    assert torch.equal(*_copies(incoming.weight, 0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    gaps = []
    for step in range(4):
        _step(model, optimizer, rng_seed=68 + 2 * step)
        source, clone = _copies(incoming.weight, 0)
        gaps.append(float((source - clone).abs().max()))
    return gaps


@pytest.mark.parametrize("kind", ["gpthost", "llama"])
def test_a_clone_leaves_its_source_within_a_few_steps(kind):
    gaps = _clone_gaps(kind, "random")
    assert gaps[0] > 0 and gaps[-1] > 1e-3 and gaps[-1] > gaps[0]
    # the uneven split of the outgoing column is what tells them apart: split evenly, a unit
    # and its clone get equal gradients and stay equal
    assert _clone_gaps(kind, "even") == [0.0] * 4


def test_a_clone_carries_its_sources_moments():
    model, optimizer = _trained("gpthost", rng_seed=69)
    mlp = model.blocks[0].mlp
    old = {(name, key): optimizer.state[layer.weight][key].clone()
           for name, layer in (("c_fc", mlp.c_fc), ("c_proj", mlp.c_proj))
           for key in ("exp_avg", "exp_avg_sq")}
    widen(model, WidthGrowth(factor=2, new_units="clone"), optimizer)
    m, d = 4 * WIDTH, WIDTH
    units, stream = (slice(0, m), slice(m, 2 * m)), (slice(0, d), slice(d, 2 * d))
    for key in ("exp_avg", "exp_avg_sq"):
        incoming, outgoing = optimizer.state[mlp.c_fc.weight][key], optimizer.state[
            mlp.c_proj.weight][key]
        for unit in units:  # the old units and their clones
            for copy_ in stream:  # both copies of the stream
                assert torch.equal(incoming[unit, copy_], old["c_fc", key])
                assert torch.equal(outgoing[copy_, unit], old["c_proj", key])
    _step(model, optimizer, rng_seed=70)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --- the optimizer -------------------------------------------------------------------------------
def _trained(kind: str, rng_seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = build(kind, rng_seed=rng_seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        _step(model, optimizer, rng_seed=rng_seed + 1 + 2 * step)
    return model, optimizer


def test_copied_moments_follow_each_entry_and_new_entries_start_quiet():
    model, optimizer = _trained("gpthost", rng_seed=21)
    groups = [[id(p) for p in g["params"]] for g in optimizer.param_groups]
    c_fc = model.blocks[0].mlp.c_fc.weight
    old = {k: v.clone() for k, v in optimizer.state[c_fc].items()}
    result = widen(model, WidthGrowth(factor=2, split="even"), optimizer)
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == groups
    state = optimizer.state[c_fc]
    assert state["exp_avg"].shape == c_fc.shape and torch.equal(state["step"], old["step"])
    d, m = WIDTH, 4 * WIDTH
    for copy_index in range(2):  # each old unit's columns, in both copies, carry its moments
        columns = slice(copy_index * d, (copy_index + 1) * d)
        assert torch.equal(state["exp_avg"][:m, columns], old["exp_avg"])
        assert torch.equal(state["exp_avg_sq"][:m, columns], old["exp_avg_sq"])
    new = result.fresh["blocks.0.mlp.c_fc.weight"]
    assert not state["exp_avg"][new].any()
    assert torch.equal(state["exp_avg_sq"][new],
                       torch.full_like(state["exp_avg_sq"][new], float(old["exp_avg_sq"].mean())))
    _step(model, optimizer, rng_seed=30)  # and it steps on
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_reset_moments_drop_the_widened_state_only():
    model, optimizer = _trained("llama", rng_seed=31)
    attention = model.model.layers[0].self_attn.q_proj.weight
    kept = optimizer.state[attention]["exp_avg"].clone()
    widen(model, WidthGrowth(factor=1, mlp=2, moments="reset"), optimizer)
    assert model.model.layers[0].mlp.up_proj.weight not in optimizer.state
    assert torch.equal(optimizer.state[attention]["exp_avg"], kept)  # it did not grow
    _step(model, optimizer, rng_seed=32)
    assert int(optimizer.state[model.model.layers[0].mlp.up_proj.weight]["step"]) == 1


def test_training_resumes_exactly_from_a_widened_checkpoint(tmp_path):
    model, optimizer = _trained("gpthost", rng_seed=45)
    widen(model, WidthGrowth(factor=2), optimizer)
    _step(model, optimizer, rng_seed=46)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               tmp_path / "wide.pt")
    saved = torch.load(tmp_path / "wide.pt", weights_only=False)
    resumed = GPTHost(model.hparams.preset).train()  # built wide from the saved config
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-3)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer.load_state_dict(saved["optimizer"])
    for step in range(2):
        _step(model, optimizer, rng_seed=47 + 2 * step)
        _step(resumed, resumed_optimizer, rng_seed=47 + 2 * step)
    for (name, p), q in zip(model.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q), name


# --- configs follow: Hugging Face round trip, the project's and a user's config ------------------
@pytest.mark.parametrize("kind", HF)
def test_a_widened_hugging_face_model_goes_back_at_its_new_width(kind, tmp_path):
    model = build(kind, rng_seed=33)
    widen(model, WidthGrowth(factor=2))
    idx = tokens((2, 12), rng_seed=34)
    with torch.no_grad():
        wide = logits(model, idx)
    model.save_pretrained(tmp_path / kind)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / kind).eval()
    assert again.config.hidden_size == 2 * WIDTH
    with torch.no_grad():
        assert torch.equal(logits(again, idx), wide)


def test_mlp_only_widening_goes_back_through_the_config(tmp_path):
    model = build("gpt2", rng_seed=35)
    widen(model, WidthGrowth(factor=1, mlp=2))
    assert model.config.n_inner == 8 * WIDTH  # None (4 x width) no longer says it
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    idx = tokens((2, 12), rng_seed=36)
    with torch.no_grad():
        assert torch.equal(logits(again, idx), logits(model, idx))


def test_the_projects_gpt_and_a_users_dataclass_config_follow():
    host = build("gpthost", rng_seed=37)
    widen(host, WidthGrowth(factor=2))
    assert (host.config.n_embd, host.config.n_head) == (2 * WIDTH, 2 * HEADS)
    assert host.hparams.preset == host.config  # a checkpoint builds the wide host
    assert all(slot.channels == 2 * WIDTH for slot in host.slots.values())
    again = GPTHost(host.hparams.preset)
    again.load_state_dict(host.state_dict())
    nano = build("nanogpt", rng_seed=38)
    widen(nano, WidthGrowth(factor=2))
    assert (nano.config.n_embd, nano.config.n_head) == (2 * WIDTH, 2 * HEADS)
    assert nano.transformer.h[0].attn.n_embd == 2 * WIDTH


def test_an_empty_slot_takes_the_new_width_and_a_seed_grows_there():
    host = build("gpthost", rng_seed=39)
    widen(host, WidthGrowth(factor=2))
    slot = host.slots["r0c0"]
    slot.germinate("lora")
    with torch.no_grad():
        assert host(tokens((2, 8), rng_seed=40)).shape == (2, 8, VOCAB)


def test_depth_then_width_composes():
    model = build("gpt2", rng_seed=41)
    idx = tokens((2, 12), rng_seed=42)
    with torch.no_grad():
        before = logits(model, idx)
    grow(model, DepthGrowth("transformer.h", blocks=2), "identity")  # zero output projections
    widen(model, WidthGrowth(factor=2))
    assert (model.config.n_layer, model.config.n_embd) == (4, 2 * WIDTH)
    with torch.no_grad():
        torch.testing.assert_close(logits(model, idx), before, rtol=0, atol=1e-5)


# --- compute ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpthost", "llama"])
def test_the_flop_meter_counts_the_widened_model_as_the_native_one(kind):
    model = build(kind, rng_seed=43)
    meter, x = FlopMeter(), torch.zeros(2, 12, dtype=torch.long)

    def forward(m: nn.Module, idx: Tensor) -> Tensor:
        return logits(m, idx)

    narrow = meter.training_step(model, x, forward)
    widen(model, WidthGrowth(factor=2))
    wide = meter.training_step(model, x, forward)
    assert wide == FlopMeter().training_step(build(kind, 2, rng_seed=44), x, forward)
    assert wide > 2 * narrow and meter.measurements == 2


# --- refusals, in one line ----------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"factor": 1.5}, "WidthGrowth factor must be an int >= 1 (the new width is factor times "
                      "the old), got 1.5"),
    ({"factor": 0}, "WidthGrowth factor must be an int >= 1"),
    ({"factor": 2, "mlp": True}, "WidthGrowth mlp must be an int >= 1"),
    ({"factor": 1}, "WidthGrowth factor=1 and mlp=1 grow nothing; accepted: factor >= 2"),
    ({"split": "half"}, "WidthGrowth split must be one of random, even, got 'half'"),
    ({"moments": "fresh"}, "WidthGrowth moments must be one of copy, reset, got 'fresh'"),
    ({"init_std": 0.0}, "WidthGrowth init_std must be a finite number > 0 or None, got 0.0"),
    ({"init_std": float("inf")}, "WidthGrowth init_std must be a finite number > 0 or None, "
                                 "got inf"),
    ({"rng_seed": "a"}, "WidthGrowth rng_seed must be an int, got 'a'"),
    ({"layout": "Llama"}, "WidthGrowth layout must be a BlockLayout, one of 'nanoGPT and Hugging "
                          "Face GPT-2', 'Hugging Face Llama'"),
    ({"new_units": "copy"}, "WidthGrowth new_units must be one of random, clone, got 'copy'"),
    ({"new_units": "clone", "init_std": 0.02}, "WidthGrowth init_std=0.02 with "
                                               "new_units='clone': cloned heads and units draw"),
])
def test_bad_width_growth_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        WidthGrowth(**kwargs)
    assert one_line(err).startswith(message)


class Mixer(nn.Module):
    """A block of no known layout."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.mix = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mix(x)


class Stacked(nn.Module):
    def __init__(self, blocks: list[nn.Module], head: nn.Module | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = head or nn.Linear(WIDTH, VOCAB)


def _refused(model: nn.Module, growth: WidthGrowth) -> str:
    """`widen`'s refusal, which `check_widen` says the same before (nothing changes)."""
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError) as early:
        check_widen(model, growth)
    with pytest.raises(ValueError) as err:
        widen(model, growth)
    assert str(early.value) == str(err.value)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items()
               if isinstance(v, Tensor))  # nothing changed
    return one_line(err)


@pytest.mark.parametrize("kind", KINDS)
def test_check_widen_passes_what_widen_widens_and_changes_nothing(kind):
    model = build(kind)
    before = shapes(model)
    assert check_widen(model, WidthGrowth(factor=2)) is None
    assert shapes(model) == before


def test_a_block_of_no_known_layout_is_refused():
    message = _refused(Stacked([Mixer(), Mixer()]), WidthGrowth())
    assert message == ("WidthGrowth: Mixer has no known width layout (its layers: mix); accepted: "
                       f"blocks laid out as {'; '.join(LAYOUTS)}, or "
                       "WidthGrowth(layout=BlockLayout(...)) naming its parts")


def test_a_layout_that_names_the_wrong_layers_is_refused():
    layout = BlockLayout(("ln_1", "ln_2"), ("attn.c_attn",), "attn.c_proj", ("mlp.c_proj",),
                         "mlp.c_fc")
    message = _refused(build("gpthost"), WidthGrowth(layout=layout))
    assert message.startswith("WidthGrowth: blocks.0.mlp.c_proj maps 64 -> 16, not 16 -> 16 as "
                              "its layout's place needs")
    fused = BlockLayout(("ln_1", "ln_2"), ("attn.c_proj",), "attn.c_attn", ("mlp.c_fc",),
                        "mlp.c_proj")
    message = _refused(build("gpthost"), WidthGrowth(layout=fused))
    assert message.startswith("WidthGrowth: blocks.0.attn.c_proj has 16 outputs, not three")


def test_a_parameter_the_layout_does_not_name_is_refused():
    model = build("gpthost")
    for block in model.blocks:
        block.scale = nn.Parameter(torch.ones(WIDTH))
    message = _refused(model, WidthGrowth(stack="blocks"))
    assert message.startswith("WidthGrowth: blocks.0 has a parameter 'scale' its layout does not "
                              "name")


def test_an_unknown_module_outside_the_stack_is_refused():
    model = build("nanogpt-untied")
    model.extra = nn.Conv1d(WIDTH, WIDTH, 1)
    message = _refused(model, WidthGrowth())
    assert message.startswith("WidthGrowth: extra is a Conv1d, which width growth does not know")


def test_a_tied_head_without_a_final_norm_is_refused():
    model = build("nanogpt")
    del model.transformer.ln_f
    message = _refused(model, WidthGrowth())
    assert message.startswith("WidthGrowth: the output head is tied to the token table and needs "
                              "one final norm after the stack to scale by 1/k, found none")


def test_a_layout_may_be_named():
    assert WidthGrowth(layout="Hugging Face Llama").layout is LAYOUTS["Hugging Face Llama"]
    model = build("llama")
    widen(model, WidthGrowth(layout="Hugging Face Llama"))
    assert model.config.hidden_size == 2 * WIDTH


def test_another_reader_of_a_tied_heads_final_norm_is_refused():
    # Its output was silently divided by k (the final norm is scaled by 1/k for the tied head):
    # GPT2DoubleHeadsModel's multiple-choice logits came out halved.
    message = ("WidthGrowth: the output head is tied to the token table, so the final norm is "
               "scaled by 1/k, and {} also read(s) width {}; accepted: a tied head as the only "
               "layer reading the stream, or an untied head")
    model = build("nanogpt")
    model.value_head = nn.Linear(WIDTH, 1)
    assert _refused(model, WidthGrowth()) == message.format("value_head", WIDTH)
    torch.manual_seed(0)
    double = GPT2DoubleHeadsModel(GPT2Config(n_layer=1, n_embd=WIDTH, n_head=HEADS,
                                             n_positions=BLOCK, vocab_size=VOCAB))
    assert _refused(double, WidthGrowth()) == message.format("multiple_choice_head.summary",
                                                             WIDTH)


def test_a_head_no_layer_shows_is_refused():
    # F.linear(ln_f(x), wte.weight): no tie to see, so the final norm kept its scale and the
    # logits came out k times the old.
    model = build("nanogpt")
    del model.lm_head
    assert _refused(model, WidthGrowth()) == (
        f"WidthGrowth: no layer outside the stack reads the stream (width {WIDTH}), so the "
        "output head cannot be told tied or not (a head computed as F.linear(x, wte.weight)?); "
        "accepted: an nn.Linear head, tied by sharing the token table's weight or untied")


def test_a_final_norm_that_does_not_scale_with_its_gain_before_a_tied_head_is_refused():
    # Gemma's RMSNorm computes x̂·(1 + w): scaling w by 1/k left its logits 2.04 away.
    torch.manual_seed(0)
    model = GemmaForCausalLM(GemmaConfig(
        hidden_size=WIDTH, intermediate_size=UNITS, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, vocab_size=VOCAB, max_position_embeddings=BLOCK,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)).eval()
    assert _refused(model, WidthGrowth()) == (
        "WidthGrowth: the final norm model.norm (GemmaRMSNorm) before the tied head does not "
        "scale its output with its gain (x̂·(1 + w)?), so the logits cannot be kept; accepted: "
        "a final LayerNorm/RMSNorm computing x̂·w (+ b), or an untied head")


def test_attention_without_a_head_count_is_refused():
    model = build("nanogpt-untied")
    for block in model.transformer.h:
        del block.attn.n_head
    message = _refused(model, WidthGrowth())
    assert message.startswith("WidthGrowth: transformer.h.0 (NanoBlock) keeps no head count")


def test_a_slot_holding_a_seed_is_refused():
    host = build("gpthost")
    host.slots["r0c1"].germinate("lora")
    message = _refused(host, WidthGrowth())
    assert message.startswith("WidthGrowth: slot 'r0c1' holds a seed, which width growth does "
                              "not widen; accepted: a model whose slots are empty")
    assert isinstance(host.slots["r0c1"], SeedSlot)


def test_a_config_that_cannot_say_the_mlp_width_is_refused():
    message = _refused(build("gpthost"), WidthGrowth(factor=1, mlp=2))
    assert message == ("WidthGrowth: GPTConfig cannot say the new MLP width 128: it has no field "
                       "for the MLP's width (intermediate_size, n_inner, ffn_dim); accepted: mlp "
                       "equal to factor for this model")


def test_a_model_without_a_stack_is_refused_as_width_growth():
    message = _refused(nn.Sequential(nn.Linear(4, 4)), WidthGrowth())
    assert message.startswith("WidthGrowth(stack=None) finds no stack of same-shape blocks")


def test_a_model_widened_between_steps_trains_on_while_last_steps_graph_is_alive():
    # The frontier's and a Trainer's loop keep the previous step's loss (and its graph) until
    # the next forward: widening between steps must not leave a leaf's stale accumulator.
    torch.manual_seed(0)
    model = GPTHost(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16),
                    slots=())
    optimizer = model.configure_optimizers()
    tokens = torch.randint(0, 64, (2, 8))
    loss = model(tokens).logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    widen(model, WidthGrowth(2, stack="blocks"), optimizer)
    loss = model(tokens).logsumexp(-1).mean()  # the last step's ``loss`` alive until here
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert model.tok_emb.weight.grad.shape == (64, 32)
    assert model.head.weight is model.tok_emb.weight  # the tie holds


def test_a_graph_not_yet_backpropagated_is_refused_and_nothing_changes():
    torch.manual_seed(0)
    model = GPTHost(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16),
                    slots=())
    optimizer = model.configure_optimizers()
    model(torch.randint(0, 64, (2, 8))).sum().backward()
    optimizer.step()
    shapes = {n: p.shape for n, p in model.named_parameters()}
    state = {n: optimizer.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}
    held = model(torch.randint(0, 64, (2, 8)))  # a graph that still holds the weights
    with pytest.raises(RuntimeError, match=r"widen: .* is held by a graph not yet "
                                            r"backpropagated"):
        widen(model, WidthGrowth(2, stack="blocks"), optimizer)
    assert {n: p.shape for n, p in model.named_parameters()} == shapes
    assert all(torch.equal(optimizer.state[p]["exp_avg"], state[n])
               for n, p in model.named_parameters())
    assert model.config.n_embd == 16
    del held
