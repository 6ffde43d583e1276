"""Depth growth on transformers the project did not write: a nanoGPT-style user model with its own
block class, one whose blocks are laid out as timm's ViT blocks, Hugging Face GPT-2 and Llama.
Identity keeps the logits, copy equals its source, the grown model has the native deeper model's
parameters and logits, every new block trains, the Hugging Face model goes back to its ecosystem
at its new depth, and what cannot grow is refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM
from user_models import STACKS, UserBlock, stack_of, user_model

from esper_lightning.blueprints.growth import GatedBlock, GrownBlocks
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.depth import DepthGrowth, find_stack, grow, materialize
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.injection import restore_slots
from esper_lightning.core.lifecycle import SeedStage

KINDS = sorted(STACKS)


def _tokens(shape: tuple[int, ...], rng_seed: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(rng_seed))


def _grow(kind: str, operator: str, blocks: int | tuple[int, ...] = 3, rng_seed: int = 0,
          **growth):
    """A one-block model of ``kind`` with growth slots on top, seen one batch, and its engine."""
    model = user_model(kind, n_layer=1, rng_seed=rng_seed).eval()
    engine = MorphogenesisEngine(model, growth=DepthGrowth(STACKS[kind], blocks=blocks,
                                                           **growth))
    with torch.no_grad():
        model(_tokens((2, 8), rng_seed=1))  # the slots learn their width; checks run here
    return model, engine


def _germinate(engine: MorphogenesisEngine, operator: str, slot: int = 0) -> None:
    outcome = engine.execute(Action(LifecycleOp.GERMINATE, slot, blueprint=f"block_{operator}"))
    assert outcome.success, outcome.reason


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("kind", KINDS)
def test_identity_growth_leaves_the_logits_equal(kind):
    model, engine = _grow(kind, "identity")
    idx = _tokens((3, 12), rng_seed=2)
    with torch.no_grad():
        before = model(idx)
    _germinate(engine, "identity")
    slot = next(iter(engine.slots.values()))
    assert slot.stage == SeedStage.BLENDING and slot.alpha == 1.0 and len(slot.seed) == 3
    assert slot.identity_mode == "projections"  # checked on the first activation
    with torch.no_grad():
        assert torch.equal(model(idx), before)
    source = stack_of(model, kind)[0]
    assert all(type(b) is type(source) for b in slot.seed)  # the user's own block class


def test_the_docs_say_what_identity_growth_measures():
    # test_identity_growth_leaves_the_logits_equal compares the logits with torch.equal: the
    # README and the tutorial claim exactly that, in the same words.
    root = Path(__file__).resolve().parent.parent
    for page in ("README.md", "docs/tutorials/grow-a-transformer.md"):
        text = " ".join((root / page).read_text().split())
        assert "zero, so the model's logits stay the same, bit for bit)" in text, page
        assert "up to float rounding" not in text, page


@pytest.mark.parametrize("kind", KINDS)
def test_copy_blocks_equal_their_source(kind):
    model, engine = _grow(kind, "copy")
    _germinate(engine, "copy")
    seed = next(iter(engine.slots.values())).seed
    source = stack_of(model, kind)[0]
    assert isinstance(seed, GrownBlocks) and all(_same(b, source) for b in seed)
    assert not source._forward_hooks or not any(b._forward_hooks for b in seed)  # no slot hook


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("operator", ["copy", "identity", "random"])
def test_a_grown_model_is_the_native_deeper_model(kind, operator):
    model, engine = _grow(kind, operator, rng_seed=3)
    _germinate(engine, operator)
    slot = next(iter(engine.slots.values()))
    while slot.alpha < 1.0:
        engine.tick()
    native = user_model(kind, n_layer=4, rng_seed=4).eval()
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in
                                                             native.parameters())
    blocks = [stack_of(model, kind)[0], *slot.seed]
    with torch.no_grad():  # the native model with the grown one's weights
        for name, p in native.named_parameters():
            if not any(name.startswith(f"{STACKS[kind]}.{i}.") for i in range(4)):
                p.copy_(dict(model.named_parameters())[name])
        for target, block in zip(stack_of(native, kind), blocks, strict=True):
            target.load_state_dict(block.state_dict())
    idx = _tokens((2, 12), rng_seed=5)
    with torch.no_grad():
        assert torch.equal(model(idx), native(idx))


@pytest.mark.parametrize("kind", KINDS)
def test_a_training_step_after_growth_changes_every_new_block(kind):
    model, engine = _grow(kind, "identity")
    model.train()
    optimizer = model.configure_optimizers()
    engine.attach_optimizer(optimizer)
    _germinate(engine, "identity")
    seed = next(iter(engine.slots.values())).seed
    before = [copy.deepcopy(b.state_dict()) for b in seed]
    idx, targets = _tokens((2, 12), rng_seed=6), _tokens((2, 12), rng_seed=7)
    F.cross_entropy(model(idx).flatten(0, 1), targets.flatten()).backward()
    for block in seed:  # the zeroed projections get gradient at once
        grads = [p.grad for p in block.parameters() if p.grad is not None and p.grad.any()]
        assert grads, kind
    optimizer.step()
    for block, old in zip(seed, before, strict=True):
        changed = [k for k, v in block.state_dict().items() if not torch.equal(v, old[k])]
        assert changed, kind


def test_new_blocks_join_the_users_weight_decay_groups():
    model, engine = _grow("nanogpt", "copy")
    engine.attach_optimizer(model.configure_optimizers())
    _germinate(engine, "copy")
    groups = {g["name"]: g for g in engine.optimizer.param_groups}
    seed = next(iter(engine.slots.values())).seed
    decayed = {id(p) for p in groups["seed/blocks.0+1"]["params"]}
    assert decayed == {id(p) for p in seed.parameters() if p.dim() >= 2}
    assert groups["seed/blocks.0+1"]["weight_decay"] == 0.1
    assert groups["seed/blocks.0+1/no_decay"]["weight_decay"] == 0.0


def test_several_growth_events_chain_one_to_two_to_four():
    model, engine = _grow("nanogpt", "copy", blocks=(1, 2))
    assert list(engine.slots) == ["blocks.0+1", "blocks.0+2"]
    _germinate(engine, "copy", slot=0)
    (first,) = engine.slots["blocks.0+1"].seed
    with torch.no_grad():
        first.ln_1.weight.add_(0.5)  # it trained away from block 0
    _germinate(engine, "copy", slot=1)
    second = engine.slots["blocks.0+2"].seed
    assert len(second) == 2  # copies of both blocks before it, in order (stacking)
    assert _same(second[0], model.blocks[0]) and _same(second[1], first)


def test_interleaved_growth_follows_every_block_with_its_copy():
    torch.manual_seed(0)
    model = user_model("nanogpt", n_layer=2).eval()
    engine = MorphogenesisEngine(model, growth=DepthGrowth("blocks", at="interleave"))
    assert list(engine.slots) == ["blocks.0+1", "blocks.1+1"]
    model(_tokens((1, 4), rng_seed=0))
    for slot in range(2):
        _germinate(engine, "copy", slot=slot)
    assert _same(engine.slots["blocks.0+1"].seed[0], model.blocks[0])
    assert _same(engine.slots["blocks.1+1"].seed[0], model.blocks[1])
    engine_at = MorphogenesisEngine(user_model("nanogpt", n_layer=3),
                                    growth=DepthGrowth("blocks", at=1))
    assert list(engine_at.slots) == ["blocks.1+1"]


def test_interleaved_growth_of_two_blocks_copies_each_blocks_own():
    # Block 1's slot was made from blocks 0 and 1 (the last two before it), where interleaving
    # promises copies of its own block.
    torch.manual_seed(0)
    stack = nn.Module()
    stack.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
    b0, b1 = (copy.deepcopy(b) for b in stack.blocks)
    grow(stack, DepthGrowth("blocks", blocks=2, at="interleave"), "copy")
    assert [_same(b, b0) for b in stack.blocks] == [True, True, True, False, False, False]
    assert [_same(b, b1) for b in stack.blocks] == [False, False, False, True, True, True]
    model = user_model("nanogpt", n_layer=2).eval()
    engine = MorphogenesisEngine(model, growth=DepthGrowth("blocks", blocks=2, at="interleave"))
    model(_tokens((1, 4), rng_seed=0))
    _germinate(engine, "copy", slot=1)
    assert all(_same(b, model.blocks[1]) for b in engine.slots["blocks.1+1"].seed)


def test_a_named_block_with_another_place_is_refused():
    # at=1 was dropped: the new block went after block 0.
    stack = nn.Module()
    stack.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
    for at in (1, "interleave"):
        with pytest.raises(ValueError) as err:
            grow(stack, DepthGrowth("blocks.0", at=at), "copy")
        assert _first_line(err) == (f"DepthGrowth stack names block 0 and at={at!r} another "
                                    "place; accepted: the stack's path with at=, or one of its "
                                    "blocks with the default at='top'")
    assert len(stack.blocks) == 2


def test_attention_scaled_by_its_layer_index_is_refused():
    # Each new block kept its source's 1/(layer_idx + 1): the grown model was not the natively
    # deeper one, and from_pretrained gave other logits.
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_embd=32, n_head=4, n_positions=16, vocab_size=64,
                        scale_attn_by_inverse_layer_idx=True)
    message = ("DepthGrowth: transformer.h.0.attn scales its attention by 1/(layer_idx + 1) "
               "(scale_attn_by_inverse_layer_idx=True), so a grown block cannot compute as both "
               "its source and the natively deeper model; accepted: "
               "scale_attn_by_inverse_layer_idx=False")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    with pytest.raises(ValueError) as err:
        grow(model, DepthGrowth("transformer.h"), "copy")
    assert _first_line(err) == message and len(model.transformer.h) == 1
    with pytest.raises(ValueError) as err:
        MorphogenesisEngine(model, growth=DepthGrowth("transformer.h"))
    assert _first_line(err) == message


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_grown_hugging_face_model_goes_back_at_its_new_depth(kind, tmp_path):
    model, engine = _grow(kind, "copy", rng_seed=8)
    _germinate(engine, "copy")
    slot = next(iter(engine.slots.values()))
    while slot.alpha < 1.0:
        engine.tick()
    slot.advance()
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    slot.record_contribution(0.0)
    assert slot.fossilize().passed
    idx = _tokens((2, 12), rng_seed=9)
    with torch.no_grad():
        grown = model(idx)
    # The slots hang off the LightningModule: its Hugging Face model alone has none, and
    # handing that back (still one block deep) is refused, where it was silently [].
    with pytest.raises(ValueError, match=r"^materialize found no growth slot in .*: the growth "
                                         r"slots of its stack '.*' are in the module that holds"):
        materialize(model.model)
    with pytest.raises(ValueError, match=r"the growth slots of this stack are in the module"):
        materialize(stack_of(model, kind))
    with pytest.raises(TypeError, match=r"^materialize takes the grown module .*, got Trainer"):
        materialize(L.Trainer(logger=False))
    assert materialize(model) == [slot.slot_id]
    assert materialize(model) == [] and materialize(model.model) == []  # nothing left to move
    assert len(stack_of(model, kind)) == 4 and len(model.esper_slots) == 0  # slots gone
    assert model.model.config.num_hidden_layers == 4
    assert [m.layer_idx for b in stack_of(model, kind) for m in b.modules()
            if hasattr(m, "layer_idx")][-1] == 3
    with torch.no_grad():
        assert torch.equal(model(idx), grown)
    model.model.save_pretrained(tmp_path / kind)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / kind).eval()
    assert again.config.num_hidden_layers == 4
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, grown)


def test_materialize_refuses_a_live_seed_and_moves_nothing():
    model, engine = _grow("nanogpt", "identity")
    _germinate(engine, "identity")
    with pytest.raises(ValueError, match=r"^growth slot 'blocks.0\+1' holds a live seed"):
        materialize(model)
    assert len(model.blocks) == 1


def test_restore_slots_rebuilds_growth_slots_for_a_fresh_model():
    model, engine = _grow("gpt2", "copy", blocks=(1, 2), rng_seed=10)
    for slot in range(2):
        _germinate(engine, "copy", slot=slot)
    state = copy.deepcopy(model.state_dict())
    fresh = user_model("gpt2", n_layer=1, rng_seed=11).eval()
    assert restore_slots(fresh, state) == ("model.transformer.h.0+1", "model.transformer.h.0+2")
    fresh.load_state_dict(state)
    idx = _tokens((2, 12), rng_seed=12)
    with torch.no_grad():
        assert torch.equal(fresh(idx), model(idx))


# --- what cannot grow is refused in one line ----------------------------------------------------
class PostNorm(nn.Module):
    """A post-norm block: zero projections do not make it the identity (LN(x) != x)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.attn = nn.Module()
        self.attn.c_proj = nn.Linear(width, width)
        self.mlp = nn.Module()
        self.mlp.c_proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.attn.c_proj(x) + self.mlp.c_proj(x))


class Holder(nn.Module):
    def __init__(self, blocks, head=None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = head or nn.Linear(8, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _first_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_module_that_is_not_a_stack_is_refused():
    with pytest.raises(ValueError) as err:
        MorphogenesisEngine(Holder([UserBlock(8, 2)]), growth=DepthGrowth("head"))
    assert _first_line(err).startswith("DepthGrowth: 'head' is a Linear, not a stack of blocks "
                                       "or one of its blocks; accepted: a ModuleList")
    with pytest.raises(ValueError) as err:
        find_stack(Holder([UserBlock(8, 2), PostNorm()]), None)
    assert "finds no stack of same-shape blocks in Holder; name one" in _first_line(err)
    assert find_stack(Holder([UserBlock(8, 2), UserBlock(8, 2)]), "blocks.1")[0::2] == (
        "blocks", 1)


class Wider(UserBlock):
    """A UserBlock with one more parameter than its class has."""

    def __init__(self, width: int = 8) -> None:
        super().__init__(width, 2)
        self.scale = nn.Parameter(torch.ones(width))


@pytest.mark.parametrize(("blocks", "path", "problem"), [
    ([UserBlock(8, 2), UserBlock(16, 2)], "blocks",
     "block 1's ln_1.weight is (16,), block 0's (8,)"),
    ([UserBlock(8, 2), UserBlock(8, 2), UserBlock(16, 2)], "blocks.1",
     "block 2's ln_1.weight is (16,), block 0's (8,)"),
    ([UserBlock(8, 2), PostNorm()], "blocks", "block 1 is a PostNorm, block 0 a UserBlock"),
    ([UserBlock(8, 2), nn.Sequential()], "blocks", "block 1 is a Sequential, block 0 a UserBlock"),
    ([Wider(), Wider(), nn.Linear(8, 8)], "blocks", "block 2 is a Linear, block 0 a Wider"),
    ([], "blocks", "it holds no block"),
])
def test_a_container_of_unlike_blocks_is_refused_naming_the_block_that_differs(
        blocks, path, problem):
    with pytest.raises(ValueError) as err:
        find_stack(Holder(blocks), path)
    assert _first_line(err).startswith(f"DepthGrowth: 'blocks' is a ModuleList but not a stack "
                                       f"of same-shape blocks: {problem}; accepted: a ")


def test_a_parameter_one_block_lacks_or_adds_is_named():
    holder = Holder([UserBlock(8, 2)])
    holder.blocks.append(Wider())
    holder.blocks[1].__class__ = UserBlock  # one class, one more parameter
    with pytest.raises(ValueError) as err:
        find_stack(holder, "blocks")
    assert "block 1 has a parameter 'scale', which block 0 has not" in _first_line(err)
    holder.blocks = nn.ModuleList([holder.blocks[1], UserBlock(8, 2)])
    with pytest.raises(ValueError) as err:
        find_stack(holder, "blocks")
    assert "block 1 has no parameter 'scale', which block 0 has" in _first_line(err)


def test_a_block_that_changes_the_shape_is_refused_at_its_first_activation():
    model = Holder([nn.Linear(8, 16)], head=nn.Linear(16, 8))
    MorphogenesisEngine(model, growth=DepthGrowth("blocks"))
    with pytest.raises(ValueError) as err:
        model(torch.zeros(2, 3, 8))
    assert _first_line(err) == ("growth slot 'blocks.0+1': Linear maps a hidden state (2, 3, 8) "
                                "to (2, 3, 16); a stack that grows needs blocks that keep its "
                                "shape")


def test_identity_of_an_unknown_block_is_gated_or_refused_without_the_gate():
    torch.manual_seed(0)
    model = Holder([PostNorm()])
    engine = MorphogenesisEngine(model, growth=DepthGrowth("blocks"))
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        before = model(x)
    slot = engine.slots["blocks.0+1"]
    assert slot.identity_mode == "gate"  # zero projections were tried and did not do it
    _germinate(engine, "identity")
    assert isinstance(slot.seed[0], GatedBlock)
    with torch.no_grad():
        assert torch.equal(model(x), before)
    strict = Holder([PostNorm()])
    MorphogenesisEngine(strict, growth=DepthGrowth("blocks", gate=False))
    with pytest.raises(ValueError) as err:
        strict(x)
    assert _first_line(err).startswith("growth slot 'blocks.0+1': PostNorm with its residual "
                                       "projections at zero does not return its input")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"blocks": 0}, "DepthGrowth blocks must be an int >= 1 or a list of them, got 0"),
    ({"at": "bottom"}, "DepthGrowth at must be one of top, interleave or a block index"),
    ({"moments": "old"}, "DepthGrowth moments must be one of fresh, copy, got 'old'"),
    ({"projections": "c_proj"}, "DepthGrowth projections must be a list of names"),
    ({"blocks": 1.5}, "DepthGrowth blocks must be an int >= 1 or a list of them, got 1.5"),
    ({"stack": ""}, "DepthGrowth stack must be a module path (e.g. 'blocks') or None, got ''"),
    ({"stack": 3}, "DepthGrowth stack must be a module path (e.g. 'blocks') or None, got 3"),
    ({"gate": "no"}, "DepthGrowth gate must be True or False, got 'no'"),
])
def test_bad_depth_growth_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        DepthGrowth(**kwargs)
    assert _first_line(err).startswith(message)


# --- identity finds a block's residual projections by running it ------------------------------
class RenamedBlock(nn.Module):
    """A pre-norm block of no known layout: its attention's output is ``mix.out`` and its MLP a
    ``Sequential`` ending in ``ff.2`` (only running it tells which layers feed the residual)."""

    def __init__(self, width: int = 32, n_head: int = 4) -> None:
        super().__init__()
        self.n_head = n_head
        self.pre_mix, self.pre_ff = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mix = nn.ModuleDict({"qkv": nn.Linear(width, 3 * width),
                                  "out": nn.Linear(width, width)})
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.mix["qkv"](self.pre_mix(x)).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.mix["out"](y)
        return x + self.ff(self.pre_ff(x))


def _renamed_model(rng_seed: int = 0) -> nn.Module:
    from user_models import NanoGPT

    torch.manual_seed(rng_seed)
    return NanoGPT(1, block=RenamedBlock).eval()


@pytest.mark.parametrize("gate", [True, False])
def test_identity_of_a_block_of_no_known_layout_finds_its_projections(gate):
    model = _renamed_model()
    engine = MorphogenesisEngine(model, growth=DepthGrowth("blocks", blocks=3, gate=gate))
    idx = _tokens((3, 12), rng_seed=2)
    with torch.no_grad():
        before = model(idx)  # the first activation: the projections are found here
    slot = engine.slots["blocks.0+1"]
    assert slot.identity_mode == "projections" and slot.growth.projections == ("mix.out", "ff.2")
    _germinate(engine, "identity")
    assert [type(b) for b in slot.seed] == [RenamedBlock] * 3  # the block's own class, no gate
    with torch.no_grad():
        assert torch.equal(model(idx), before)
    source = dict(model.blocks[0].named_parameters())
    for block in slot.seed:  # only the two projections are zero; the rest is the source's
        for name, p in block.named_parameters():
            if name.startswith(("mix.out.", "ff.2.")):
                assert not p.any(), name
            else:
                assert torch.equal(p, source[name]), name


def test_grow_finds_the_projections_of_a_block_of_no_known_layout_without_an_activation():
    model = _renamed_model(rng_seed=3)
    idx = _tokens((2, 10), rng_seed=4)
    with torch.no_grad():
        before = model(idx)
    new = grow(model, DepthGrowth("blocks", blocks=2), "identity")
    assert [type(b) for b in new] == [RenamedBlock] * 2 and len(model.blocks) == 3
    with torch.no_grad():
        assert torch.equal(model(idx), before)


@pytest.mark.parametrize("kind", KINDS)
def test_projections_found_by_running_a_block_are_its_layouts_and_keep_the_logits(
        kind, monkeypatch):
    # With no layout known, every user model's block (its own class, timm's names, GPT-2's
    # Conv1D, Llama's rotary call) has its projections found on the first activation: the
    # same layers its layout names, and the logits bitwise equal after identity growth.
    from esper_lightning.blueprints.growth import layouts

    expected = layouts.layout_names(stack_of(user_model(kind), kind)[0])
    monkeypatch.setattr(layouts, "LAYOUTS", {})
    model, engine = _grow(kind, "identity")
    slot = next(iter(engine.slots.values()))
    assert slot.identity_mode == "projections" and slot.growth.projections == expected
    idx = _tokens((3, 12), rng_seed=2)
    with torch.no_grad():
        before = model(idx)
    _germinate(engine, "identity")
    assert all(type(b) is type(stack_of(model, kind)[0]) for b in slot.seed)
    with torch.no_grad():
        assert torch.equal(model(idx), before)


def test_a_resumed_slot_finds_the_projections_again_when_it_germinates():
    # The manifest keeps the mode ("projections"), not the names: a fresh model's slot, loaded
    # before any activation, finds them by running the block on a random hidden state.
    model = _renamed_model(rng_seed=5)
    MorphogenesisEngine(model, growth=DepthGrowth("blocks", blocks=2))
    idx = _tokens((2, 10), rng_seed=6)
    with torch.no_grad():
        model(idx)
    fresh = _renamed_model(rng_seed=7)
    engine = MorphogenesisEngine(fresh, growth=DepthGrowth("blocks", blocks=2))
    fresh.load_state_dict(model.state_dict())
    slot = engine.slots["blocks.0+1"]
    assert slot.identity_mode == "projections" and slot.growth.projections is None
    _germinate(engine, "identity")
    with torch.no_grad():
        assert torch.equal(fresh(idx), model(idx))
    assert [type(b) for b in slot.seed] == [RenamedBlock] * 2
    assert all(not b.mix["out"].weight.any() and not b.ff[2].weight.any() for b in slot.seed)


def test_a_post_norm_block_of_no_known_layout_is_gated_or_refused():
    class Renamed(PostNorm):  # the same block, its projections of no known layout
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = self.attn.c_proj, self.mlp.c_proj
            del self.attn, self.mlp

        def forward(self, x):
            return self.norm(x + self.a(x) + self.b(x))

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    engine = MorphogenesisEngine(gated := Holder([Renamed()]), growth=DepthGrowth("blocks"))
    with torch.no_grad():
        gated(x)
    assert engine.slots["blocks.0+1"].identity_mode == "gate"
    strict = Holder([Renamed()])
    MorphogenesisEngine(strict, growth=DepthGrowth("blocks", gate=False))
    with pytest.raises(ValueError) as err:
        strict(x)
    assert _first_line(err) == (
        "growth slot 'blocks.0+1': Renamed with its residual projections at zero does not "
        "return its input: no set of its layers at zero does (a post-norm block?), and "
        "gate=False; accepted: gate=True, or DepthGrowth(projections=[...]) naming the right "
        "ones")


# --- the functional form ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_grow_adds_blocks_to_the_stack_and_the_optimizer_in_their_sources_groups(kind):
    model = user_model(kind, n_layer=1, rng_seed=13).eval()
    optimizer = model.configure_optimizers()
    idx, targets = _tokens((2, 12), rng_seed=14), _tokens((2, 12), rng_seed=15)
    for _ in range(2):  # the block has moments by now
        optimizer.zero_grad()
        F.cross_entropy(model(idx).flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
    with torch.no_grad():
        before = model(idx)
    groups = len(optimizer.param_groups)
    new = grow(model, DepthGrowth(STACKS[kind], blocks=3, moments="copy"), "identity", optimizer)
    stack = stack_of(model, kind)
    assert len(new) == 3 and len(stack) == 4 and list(stack)[1:] == new
    with torch.no_grad():
        assert torch.equal(model(idx), before)  # identity: the same function
    assert len(optimizer.param_groups) == groups  # the user's own groups, no new ones
    source = dict(stack[0].named_parameters())
    group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
    for block in new:
        for name, p in block.named_parameters():
            assert group_of[id(p)] == group_of[id(source[name])], name
            assert int(optimizer.state[p]["step"]) == 2  # copied moments
    if kind in ("gpt2", "llama"):  # a Hugging Face config says the new depth
        assert model.model.config.num_hidden_layers == 4
    optimizer.zero_grad()
    F.cross_entropy(model(idx).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()  # the new blocks train with the rest
    with torch.no_grad():
        assert not torch.equal(model(idx), before)
