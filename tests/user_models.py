"""Transformers the project did not write, as users bring them: a nanoGPT-style LightningModule
with its own block class (or blocks laid out as timm's ViT blocks), and Hugging Face GPT-2 and
Llama built from small configs (no download), each wrapped the plain way a user would wrap one.

Imported as ``from user_models import ...`` (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 256
WIDTH = 32


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class UserBlock(nn.Module):
    """The user's own pre-norm block (nanoGPT's layout, not the library's class)."""

    def __init__(self, width: int = WIDTH, n_head: int = 4) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(width), CausalSelfAttention(width, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(width), MLP(width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TimmStyleBlock(nn.Module):
    """A block laid out as timm's VisionTransformer blocks name their parts (``norm1``,
    ``attn.qkv``, ``attn.proj``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``), causal here so that it
    models tokens: growth reads the layout, not the modality (timm itself is not installed)."""

    def __init__(self, width: int = WIDTH, n_head: int = 4) -> None:
        super().__init__()
        self.n_head = n_head
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.attn.qkv(self.norm1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.attn.proj(y)
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


class NanoGPT(L.LightningModule):
    """A byte-level GPT as a user writes one: its own blocks, embeddings, head and AdamW with
    nanoGPT's weight-decay groups (matrices decayed, vectors not)."""

    def __init__(self, n_layer: int = 1, width: int = WIDTH, block_size: int = 16,
                 lr: float = 3e-3, block: type[nn.Module] = UserBlock) -> None:
        super().__init__()
        self.lr = lr
        self.tok_emb = nn.Embedding(VOCAB, width)
        self.pos_emb = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(block(width) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # [B, T, V]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits.flatten(0, 1), y.flatten()))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = list(self.parameters())
        return torch.optim.AdamW([
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ], lr=self.lr)


def hf_gpt2(n_layer: int = 1) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=WIDTH, n_head=4,
                                      vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                                      eos_token_id=0))


def hf_llama(n_layer: int = 1) -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(hidden_size=WIDTH, intermediate_size=64,
                                        num_hidden_layers=n_layer, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=VOCAB,
                                        max_position_embeddings=64, bos_token_id=0,
                                        eos_token_id=0))


class HFLM(L.LightningModule):
    """A Hugging Face causal LM in a plain LightningModule, as a user wraps one."""

    def __init__(self, model: nn.Module, lr: float = 3e-3) -> None:
        super().__init__()
        self.model, self.lr = model, lr

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx).logits  # [B, T, V]

    training_step = NanoGPT.training_step
    validation_step = NanoGPT.validation_step

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


#: Where each model's stack of blocks is, from the LightningModule.
STACKS = {"nanogpt": "blocks", "gpt2": "model.transformer.h", "llama": "model.model.layers",
          "timm": "blocks"}


def user_model(kind: str, n_layer: int = 1, rng_seed: int = 0) -> L.LightningModule:
    """``kind`` (a key of `STACKS`) with ``n_layer`` blocks, initialised from ``rng_seed``."""
    torch.manual_seed(rng_seed)
    if kind in ("nanogpt", "timm"):
        return NanoGPT(n_layer, block=UserBlock if kind == "nanogpt" else TimmStyleBlock)
    return HFLM(hf_gpt2(n_layer) if kind == "gpt2" else hf_llama(n_layer))


def stack_of(model: nn.Module, kind: str) -> nn.ModuleList:
    module = model
    for part in STACKS[kind].split("."):
        module = getattr(module, part)
    return module
