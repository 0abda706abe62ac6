"""Tensor parallelism (Megatron-LM) for torch.nn models, applied without rewriting them.

    plan = {"transformer.h.*.attn.c_attn": tessera.tensor_parallel.Colwise(fused=3),
            "transformer.h.*.attn.c_proj": "rowwise",
            "transformer.h.*.mlp.c_fc": "colwise", "transformer.h.*.mlp.c_proj": "rowwise",
            "transformer.h.*.ln_*": "sequence",          # only acts with sequence parallelism
            "transformer.h.0": "scatter_input", "transformer.ln_f": ["sequence", "gather_output"]}
    tessera.tensor_parallel.parallelize(model, plan, tp_size=2, sequence_parallel=True)

`parallelize` rewrites the matched modules IN PLACE: each keeps its class, its name and its
nn.Parameter objects, whose data become this rank's slice of the single-device values (so a model
built from a seed and then parallelized equals the single-device model split, at any degree), and
its forward becomes the tensor-parallel one (parallel/tensor_parallel/layers.h, in C++, with the
region crossings' collectives in forward or backward). With `tensor_parallel.tp_size` > 1 in the
config and no plan applied, tessera.initialize() applies `auto_plan(model)` (DeepSpeed's AutoTP).

Styles (a string or an object; a list applies several):
  "colwise"   / Colwise(fused=1, gather_output=False)   nn.Linear, rows of the weight split (the
              output's features); `fused` equal blocks (a fused q|k|v) are each split.
  "rowwise"   / Rowwise()     nn.Linear, columns split: the input arrives split along its features;
              the partial outputs are summed (all-reduce, or reduce-scatter along the sequence).
              Both take Hugging Face's Conv1D too (GPT-2: the weight stored [in, out], cut along
              the same features); a GPT-2 attention's `split_size` follows its fused q|k|v.
  "vocab"     / Vocab()       nn.Embedding, rows (the vocabulary) split. A tied LM head that is an
              nn.Linear sharing the weight (lm_head.weight = wte.weight) takes
              Colwise(gather_output=True): the same rows, each rank computing its part of the
              vocabulary's logits, gathered for the model's own loss (or Colwise() and
              tessera.nn.vocab_parallel_cross_entropy, which never gathers them). A head written
              as F.linear(x, wte.weight) in forward cannot be reached by a plan: such a model
              calls vocab_parallel_cross_entropy itself.
  "sequence"  a module with replicated parameters that runs on activations split along the sequence
              under sequence parallelism (LayerNorm, RMSNorm): its parameters' gradients are summed
              over the tensor group. Without sequence parallelism it changes nothing.
  "scatter_input" / "gather_output": the module's first input is split along the sequence / its
              output is gathered (sequence parallelism only): where the split region begins and ends.

What a model must satisfy: its code derives per-rank sizes from the tensors it gets, not from its
config (an attention reshapes to (B, T, -1, head_dim), not to (B, T, n_head, head_dim)); heads,
hidden sizes and the vocabulary divide by tp_size (an error names the module and the sizes); with
sequence parallelism the sequence length divides by tp_size and activations are [batch, seq, ...]
(`seq_dim`).
"""
import fnmatch

import torch
import torch.nn as nn

from . import _C, comm

__all__ = ["Colwise", "Rowwise", "Vocab", "parallelize", "auto_plan", "full_tensor", "full_parameters",
           "copy_to_tensor_region", "reduce_from_tensor_region", "gather_from_sequence_region",
           "reduce_scatter_to_sequence_region", "scatter_to_sequence_region", "gather_from_tensor_region"]

_tp = _C.tensor_parallel


class Colwise:
    def __init__(self, fused=1, gather_output=False):
        self.fused, self.gather_output = int(fused), bool(gather_output)

    def __repr__(self):
        return "Colwise(fused=%d, gather_output=%s)" % (self.fused, self.gather_output)


class Rowwise:
    def __repr__(self):
        return "Rowwise()"


class Vocab:
    def __repr__(self):
        return "Vocab()"


_NAMED = {"colwise": Colwise, "rowwise": Rowwise, "vocab": Vocab}
_MARKERS = ("sequence", "scatter_input", "gather_output")


def _context(tp_size=None, device=None):
    """The process's parallel context, created with tp_size when there is none yet."""
    if tp_size is None:
        if not comm.axes_made():
            raise ValueError("tessera.tensor_parallel: give tp_size, or call tessera.comm.init_distributed("
                             "tensor_parallel=...) first")
        return comm.parallel_context()
    backend = "gloo" if device is None or device.type == "cpu" else "auto"
    return comm.parallel_context(backend, int(tp_size), 1, device=device)


# ---- the region crossings, as autograd functions of tensors (regions.h) ----

def copy_to_tensor_region(x, context=None):
    """Identity forward, all-reduce of the gradient over the tensor group backward (Megatron's f)."""
    return _tp.copy_to_tensor_region(x, context or _context())


def reduce_from_tensor_region(x, context=None):
    """All-reduce forward, identity backward (Megatron's g)."""
    return _tp.reduce_from_tensor_region(x, context or _context())


def gather_from_sequence_region(x, dim=1, context=None):
    """All-gather along `dim` forward, reduce-scatter backward (sequence parallelism's f)."""
    return _tp.gather_from_sequence_region(x, context or _context(), dim)


def reduce_scatter_to_sequence_region(x, dim=1, context=None):
    """Reduce-scatter along `dim` forward, all-gather backward (sequence parallelism's g)."""
    return _tp.reduce_scatter_to_sequence_region(x, context or _context(), dim)


def scatter_to_sequence_region(x, dim=1, context=None):
    """This rank's slice along `dim` forward, all-gather backward."""
    return _tp.scatter_to_sequence_region(x, context or _context(), dim)


def gather_from_tensor_region(x, dim=-1, context=None):
    """All-gather along `dim` forward, this rank's slice backward (every rank then computes the same)."""
    return _tp.gather_from_tensor_region(x, context or _context(), dim)


# ---- applying styles to modules ----

def _mark(p, dim, fused=1):
    """p holds this rank's slice of a tensor-parallel weight along `dim` (the engine sums its gradient
    norm over the tensor group; full_tensor() reassembles it)."""
    p._tessera_tensor_parallel = (dim, fused)


def _slice(p, ctx, dim, fused, what):
    spec = getattr(p, "_tessera_tensor_parallel", None)
    if spec is not None:  # a weight tied to one split already (an embedding read again as the LM head)
        if spec != (dim, fused):
            raise ValueError("tessera.tensor_parallel: %s is tied to a weight already split along dimension %d "
                             "(fused %d); this style splits it along dimension %d (fused %d): tied modules need "
                             "styles that cut the weight alike (\"vocab\" with \"colwise\")"
                             % (what, spec[0], spec[1], dim, fused))
        return
    with torch.no_grad():
        p.data = _tp.slice(p.data, ctx.group_rank("tensor"), ctx.group_size("tensor"), dim, fused, what)
    _mark(p, dim, fused)


def _need(module, cls, name, style):
    if not isinstance(module, cls):
        raise TypeError("tessera.tensor_parallel: %s: style %r applies to %s, not to %s"
                        % (name, style, cls.__name__, type(module).__name__))
    if getattr(module, "_tessera_style", None) is not None:
        raise ValueError("tessera.tensor_parallel: %s is already tensor-parallel (%r)" % (name, module._tessera_style))
    module._tessera_style = style


def _check_heads(parent, parent_name, t):
    for attr in ("n_head", "num_heads", "num_attention_heads", "n_kv_heads", "num_key_value_heads"):
        heads = getattr(parent, attr, None)
        if isinstance(heads, int) and heads % t != 0:
            raise ValueError("tessera.tensor_parallel: %s.%s = %d is not divisible by tensor_parallel.tp_size = %d: "
                             "each tensor rank computes whole attention heads" % (parent_name or "<root>", attr, heads, t))


def _linear_weight(module, name, style):
    """How `module` holds its weight: nn.Linear as [out, in]; Hugging Face's Conv1D (GPT-2's c_attn,
    c_proj, c_fc) as [in, out], its forward x @ W + b. Returns (the weight's output dimension, a
    function giving the weight as [out, in] for the tensor-parallel kernels: a view, no copy)."""
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None:
        _need(module, nn.Module, name, style)
        return 1, lambda: module.weight.t()
    _need(module, nn.Linear, name, style)
    return 0, lambda: module.weight


def _set_width(module, dim, t):
    """The layer's own record of the width it now holds (nn.Linear's features, Conv1D's nf)."""
    if isinstance(module, nn.Linear):
        if dim == "out":
            module.out_features //= t
        else:
            module.in_features //= t
    elif dim == "out":
        module.nf //= t


def _apply_colwise(module, name, style, ctx, sp, seq_dim):
    out_dim, weight = _linear_weight(module, name, style)
    t = ctx.group_size("tensor")
    _slice(module.weight, ctx, out_dim, style.fused, name + ".weight")
    if module.bias is not None:
        _slice(module.bias, ctx, 0, style.fused, name + ".bias")
    _set_width(module, "out", t)
    gather = style.gather_output

    def forward(x):
        return _tp.column_parallel_linear(x, weight(), module.bias, ctx, sp, seq_dim, gather)
    module.forward = forward


def _apply_rowwise(module, name, style, ctx, sp, seq_dim):
    out_dim, weight = _linear_weight(module, name, style)
    _slice(module.weight, ctx, 1 - out_dim, 1, name + ".weight")
    _set_width(module, "in", ctx.group_size("tensor"))

    def forward(x):
        return _tp.row_parallel_linear(x, weight(), module.bias, ctx, sp, seq_dim)
    module.forward = forward


def _apply_vocab(module, name, style, ctx, sp, seq_dim):
    _need(module, nn.Embedding, name, style)
    if module.padding_idx is not None or module.max_norm is not None or module.sparse:
        raise ValueError("tessera.tensor_parallel: %s: a vocabulary-parallel embedding supports no padding_idx, "
                         "max_norm or sparse gradients" % name)
    _slice(module.weight, ctx, 0, 1, name + ".weight")
    start = ctx.group_rank("tensor") * module.weight.size(0)
    module.num_embeddings = module.weight.size(0)

    def forward(ids):
        return _tp.vocab_parallel_embedding(ids, module.weight, start, ctx, sp, seq_dim)
    module.forward = forward


def _sum_over_tensor_group(ctx):
    def hook(grad):
        g = grad.clone()
        ctx.all_reduce(g, "sum", "tensor")
        return g
    return hook


def _apply_marker(module, name, marker, ctx, sp, seq_dim):
    if not sp:
        return  # every tensor rank sees the whole sequence: replicated parameters get equal gradients
    if marker == "sequence":
        for p in module.parameters():
            if hasattr(p, "_tessera_tensor_parallel"):
                raise ValueError("tessera.tensor_parallel: %s: 'sequence' is for modules with replicated parameters, "
                                 "and one of its parameters is a tensor-parallel slice" % name)
            if not getattr(p, "_tessera_sequence_parallel", False):
                p._tessera_sequence_parallel = True  # each rank's gradient covers its part of the sequence
                p.register_hook(_sum_over_tensor_group(ctx))
    elif marker == "scatter_input":
        def pre(mod, args):
            return (_tp.scatter_to_sequence_region(args[0], ctx, seq_dim),) + tuple(args[1:])
        module.register_forward_pre_hook(pre)
    else:
        def post(mod, args, output):
            return _tp.gather_from_tensor_region(output, ctx, seq_dim)
        module.register_forward_hook(post)


def _styles(value, pattern):
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for s in items:
        if isinstance(s, str):
            if s in _NAMED:
                s = _NAMED[s]()
            elif s not in _MARKERS:
                raise ValueError("tessera.tensor_parallel: plan[%r]: unknown style %r (expected one of %s, or Colwise(...))"
                                 % (pattern, s, ", ".join(list(_NAMED) + list(_MARKERS))))
        elif not isinstance(s, (Colwise, Rowwise, Vocab)):
            raise TypeError("tessera.tensor_parallel: plan[%r]: a style is a str or Colwise/Rowwise/Vocab, got %s"
                            % (pattern, type(s).__name__))
        out.append(s)
    return out


def parallelize(module, plan=None, *, tp_size=None, sequence_parallel=False, seq_dim=1):
    """Applies `plan` ({module-name pattern: style}, fnmatch patterns over named_modules(); default
    auto_plan(module)) to `module` in place on the tensor group of tp_size ranks; returns the module.
    Every tensor rank must call it (it creates the process groups when none exist)."""
    if not isinstance(module, nn.Module):
        raise TypeError("tessera.tensor_parallel.parallelize: module must be a torch.nn.Module, got %s"
                        % type(module).__name__)
    first = next(module.parameters(), None)
    ctx = _context(tp_size, first.device if first is not None else None)
    if plan is None:
        plan = auto_plan(module)
    named = list(module.named_modules())
    parents = {n: m for n, m in named}
    for pattern, value in plan.items():
        styles = _styles(value, pattern)
        matched = [(n, m) for n, m in named if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ValueError("tessera.tensor_parallel: plan[%r] matches no module of the model" % pattern)
        for name, m in matched:
            parent_name = name.rsplit(".", 1)[0] if "." in name else ""
            for s in styles:
                if isinstance(s, Colwise):
                    parent = parents.get(parent_name)
                    _check_heads(parent, parent_name, ctx.group_size("tensor"))
                    _apply_colwise(m, name, s, ctx, sequence_parallel, seq_dim)
                    if s.fused > 1 and isinstance(getattr(parent, "split_size", None), int):
                        # Hugging Face's GPT-2 attention cuts its fused q|k|v output by this width.
                        parent.split_size //= ctx.group_size("tensor")
                elif isinstance(s, Rowwise):
                    _apply_rowwise(m, name, s, ctx, sequence_parallel, seq_dim)
                elif isinstance(s, Vocab):
                    _apply_vocab(m, name, s, ctx, sequence_parallel, seq_dim)
                else:
                    _apply_marker(m, name, s, ctx, sequence_parallel, seq_dim)
    module._tessera_tensor_parallel = {"tp_size": ctx.group_size("tensor"), "sequence_parallel": bool(sequence_parallel)}
    if sequence_parallel:
        from . import checkpointing
        checkpointing.set_sequence_parallel(True)  # checkpointed inputs are split already
    return module


# Linear layers by the names transformer implementations give them (GPT-2, LLaMA, GPT-NeoX, BLOOM,
# Falcon, MPT, Mistral), like DeepSpeed's AutoTP.
_FUSED_QKV = {"c_attn", "qkv", "qkv_proj", "query_key_value", "Wqkv", "W_pack"}
_COLWISE = {"q_proj", "k_proj", "v_proj", "query", "key", "value", "wq", "wk", "wv", "c_fc", "fc1", "up_proj",
            "gate_proj", "w1", "w3", "dense_h_to_4h", "fc_in"}
_ROWWISE = {"o_proj", "out_proj", "wo", "c_proj", "fc2", "down_proj", "w2", "dense_4h_to_h", "fc_out", "dense"}


def auto_plan(module):
    """A plan for a standard transformer: inside the repeated blocks (the largest nn.ModuleList),
    q/k/v, fused qkv and up projections column-wise, output and down projections row-wise, the
    norms "sequence"; the first block scatters its input and the first norm after the blocks gathers
    its output (used only with sequence parallelism)."""
    # An MoE layer's experts (tessera.moe: replicated over the tensor group) are never the blocks.
    experts = [n for n, m in module.named_modules() if type(m).__name__ == "Experts" and hasattr(m, "deepspeed_experts")]
    lists = [(n, m) for n, m in module.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0 and
             not any(n == e or n.startswith(e + ".") for e in experts)]
    if not lists:
        raise ValueError("tessera.tensor_parallel.auto_plan: the model has no nn.ModuleList of blocks; give a plan "
                         "(module-name pattern -> 'colwise' / 'rowwise' / ...)")
    blocks_name, blocks = max(lists, key=lambda nm: len(nm[1]))
    plan = {}
    inside_experts = [n[len(blocks_name) + 3:] for n in experts if n.startswith(blocks_name + ".0.")]
    for name, m in blocks[0].named_modules():
        if any(name == e or name.startswith(e + ".") for e in inside_experts):
            continue  # an MoE layer's experts stay whole on every tensor rank
        leaf = name.rsplit(".", 1)[-1]
        pattern = "%s.*.%s" % (blocks_name, name)
        if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D":  # Hugging Face GPT-2's layers are Conv1D
            if leaf in _FUSED_QKV:
                plan[pattern] = Colwise(fused=3)
            elif leaf in _COLWISE:
                plan[pattern] = "colwise"
            elif leaf in _ROWWISE:
                plan[pattern] = "rowwise"
        elif name and "norm" in type(m).__name__.lower():
            plan[pattern] = "sequence"
    if not any(not isinstance(v, str) or v in _NAMED for v in plan.values()):
        raise ValueError("tessera.tensor_parallel.auto_plan: no linear layer of %s.0 has a name it knows (%s); give a plan"
                         % (blocks_name, ", ".join(sorted(_FUSED_QKV | _COLWISE | _ROWWISE))))
    plan["%s.0" % blocks_name] = "scatter_input"
    names = [n for n, _ in module.named_modules()]
    after = names[names.index(blocks_name) + 1:]
    for n in after:
        if n.startswith(blocks_name + "."):
            continue
        if "norm" in type(dict(module.named_modules())[n]).__name__.lower():
            plan[n] = ["sequence", "gather_output"]
            break
    else:
        plan["%s.%d" % (blocks_name, len(blocks) - 1)] = "gather_output"
    return plan


# ---- reading a tensor-parallel model whole ----

def split_of(p):
    """(dim, fused): how parameter `p` is cut over the tensor group (tensor_parallel_slice's
    arguments), or (-1, 1) when every tensor rank holds it whole. The engine keeps it per parameter
    so that a checkpoint records which elements of the whole each slice holds."""
    dim, fused = getattr(p, "_tessera_tensor_parallel", (-1, 1))
    return int(dim), int(fused)


def full_tensor(p, context=None):
    """The whole (single-device) value of parameter `p`: its slices gathered from the tensor group
    when it is tensor-parallel, else p itself. A collective: every tensor rank calls it."""
    spec = getattr(p, "_tessera_tensor_parallel", None)
    if spec is None:
        return p.detach()
    dim, fused = spec
    return _tp.whole(p.detach(), context or _context(), dim, fused)


def full_parameters(module, context=None):
    """[(name, whole value)] for every parameter of `module`, in named_parameters() order."""
    return [(n, full_tensor(p, context)) for n, p in module.named_parameters()]
