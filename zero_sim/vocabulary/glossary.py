"""The glossary: every term a reader meets in the notebooks and docs, written down once.

This module is the one source.  ``docs/glossary.md`` is generated from it::

    python -m zero_sim.vocabulary.glossary > docs/glossary.md

and ``tests/test_glossary.py`` fails when that file is out of date, when a notebook uses
a term before it links or defines it, or when a notebook links an anchor that is not here.

Each :class:`Entry` has a stable ``anchor`` (the id of its row in ``docs/glossary.md``), so
a notebook in ``notebooks/`` links it as ``[bucket](../docs/glossary.md#bucket)``, or shows
a few entries in place with a code cell::

    from zero_sim.vocabulary.glossary import glossary
    glossary("bucket", "all-reduce")

which renders them as a small table in JupyterLab (each term linked to the full page).

An entry's ``aliases`` are the other spellings a text may use for it ("weights" for
"parameter"); plurals in -s and -es are implied.  Meanings are markdown and link other
entries as ``[text](#anchor)``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

PAGE = "docs/glossary.md"
NOTEBOOK_LINK = "../docs/glossary.md"  # the page, as seen from notebooks/


def slug(text: str) -> str:
    """``"exposed communication"`` -> ``"exposed-communication"``: lower case, [a-z0-9-] only."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class Entry:
    term: str
    meaning: str
    aliases: tuple[str, ...] = ()
    anchor: str = ""
    case_sensitive: bool = False  # "ZeRO", "K": the lower-case word means something else
    section: str = field(default="", compare=False)

    def __post_init__(self):
        if not self.anchor:
            object.__setattr__(self, "anchor", slug(self.term))

    @property
    def names(self) -> tuple[str, ...]:
        """The spellings a text may use: the term and its aliases."""
        return (self.term, *self.aliases)

    def pattern(self) -> re.Pattern:
        """Any of :attr:`names` as a whole word (plural allowed), e.g. for checking a text's terms.

        "Whole word" means not glued to another letter: ``2Ψ`` and ``ZeRO-3`` count as uses
        of Ψ and ZeRO, ``reshard`` is not a use of ``shard``.
        """
        names = sorted(self.names, key=len, reverse=True)
        body = "|".join(re.escape(n) for n in names)
        flags = 0 if self.case_sensitive else re.IGNORECASE
        return re.compile(rf"(?<![^\W\d])(?:{body})(?:e?s)?(?![^\W\d])", flags)


def _e(term, meaning, *aliases, anchor="", case_sensitive=False):
    return Entry(term, " ".join(meaning.split()), tuple(aliases), anchor, case_sensitive)


# (section title, one line on the section, entries).  Order within a section: the order a
# newcomer needs them.
SECTIONS: tuple[tuple[str, str, tuple[Entry, ...]], ...] = (
    ("A training step", "What one iteration of training does, and the words for its pieces.", (
        _e("parameter", """one adjustable number inside the model (also called a *weight*). Training
           changes them; the code around them is small. A model's size is its number of parameters,
           [Ψ](#psi).""", "weight", "param"),
        _e("Ψ (Psi)", """the number of [parameters](#parameter): a count of elements, never of bytes.
           An array of Ψ numbers takes Ψ × (bytes per element): 2Ψ bytes in [bf16](#bf16), 4Ψ in
           [fp32](#fp32). "ZeRO-3 sends 3Ψ" means 3Ψ elements; in bf16 that is 6Ψ bytes.""",
           "Ψ", "Psi", anchor="psi"),
        _e("layer", """one stage of the model's function; the model is a stack of them, each with its
           own parameters, and data flows through them first to last. Here layer 0 is the embedding
           (token ids to vectors), layers 1..L the transformer blocks, layer L+1 the head (final norm,
           projection onto the vocabulary, [loss](#loss)). Ops are named after it (`fwd L3`,
           `all_gather L3`)."""),
        _e("token", """the unit of text a language model reads: a word or a piece of a word, stored as
           an integer id from a fixed vocabulary (GPT-2's has 50,257 entries). Training throughput is
           counted in tokens per second."""),
        _e("sequence", """one training example: a run of [tokens](#token) of a fixed length, the
           *sequence length* (1,024 for [GPT-2](#gpt-2), 512 for [RoBERTa](#roberta)). Compute and
           [activation](#activation) memory grow with it.""", "sequence length", "seq_len"),
        _e("batch", """the [sequences](#sequence) one [step](#step) trains on, over all
           [ranks](#rank) together (the *global batch*). Each rank takes its own
           [micro-batch](#micro-batch) of it.""", "global batch", "batch size"),
        _e("micro-batch", """the sequences one rank processes in one forward and backward pass.
           Tokens per rank per step = micro-batch × sequence length.""", "micro batch"),
        _e("step", """one iteration of training: a [forward pass](#forward-pass), a
           [backward pass](#backward-pass) and an [optimizer](#optimizer) update. Training repeats
           it many thousands of times; the simulator and the real runs report the time of one
           (steady-state) step.""", "training step"),
        _e("phase", """one of the three parts of a [step](#step), cut where the simulator and the
           overlay cut them: *forward* runs from a forward op's start until the next backward op
           starts (once per [micro-batch](#micro-batch) under gradient accumulation), *backward*
           from there until the next forward op or the last backward op's end, *optimizer* from
           there to the end of the step. The optimizer phase
           has two parts: `optimizer_wait` (compute idle, waiting for the last gradient
           communication: DDP's final [all-reduces](#all-reduce), ZeRO's
           [reduce-scatters](#reduce-scatter), or [all-gathers](#all-gather) of updated shards) and
           `optimizer_update` (the update's own compute, usually a few ms). A long optimizer phase
           usually means a slow network, not a slow optimizer.""", "optimizer phase"),
        _e("forward pass", """runs the [micro-batch](#micro-batch) through the layers, first to
           last, and computes the [loss](#loss). It saves [activations](#activation) for the backward
           pass.""", "forward"),
        _e("backward pass", """computes one [gradient](#gradient) per parameter, walking the layers
           last to first, so the last layers' gradients are ready first. It takes about twice the
           forward pass's compute.""", "backward"),
        _e("loss", """one number that says how wrong the model's predictions were on the batch;
           training lowers it."""),
        _e("gradient", """for one [parameter](#parameter): how much the [loss](#loss) changes when that
           parameter is nudged up a little. There is exactly one per parameter, so the gradients form an
           array the size of the parameters (Ψ elements).""", "grad"),
        _e("optimizer", """the update rule run at the end of each step: it moves every parameter a
           little, using its gradient. It works element by element, so each [shard](#shard) can be
           updated on its own.""", "optimizer step", "optimizer update"),
        _e("Adam", """the usual optimizer (AdamW is Adam with weight decay). It keeps two running
           averages per parameter, the [momentum and variance](#momentum), its
           [optimizer state](#optimizer-state).""", "AdamW"),
        _e("momentum and variance", """Adam's two running averages per parameter: of recent
           gradients (momentum) and of their squares (variance, which gives each parameter its own
           step size). Also called Adam's two *moments*.""", "momentum", "variance",
           anchor="momentum"),
        _e("hook", """a function PyTorch calls at a given moment, here a *backward hook*: called during
           the backward pass as soon as one parameter's gradient is complete, so a collective for it
           can start before backward ends.""", "backward hook", "post-accumulate-grad hook"),
        _e("compiled backward", """a backward pass turned by `torch.compile` into one compiled graph.
           Per-parameter [hooks](#hook) then fire only when the whole graph has finished, that is at
           the end of backward."""),
    )),
    ("Numbers and memory", "Formats, the memory a step holds, and how the simulator counts it.", (
        _e("fp32", """the ordinary 32-bit floating-point number: 4 bytes per element."""),
        _e("bf16", """"brain float 16", a 16-bit floating-point format: 2 bytes per element, fp32's range
           with fewer significant digits; GPUs compute on it much faster."""),
        _e("quantization", """storing numbers in fewer bits (int8: 1 byte, int4: half a byte) with one
           scale per block of them, so each comes back as its integer times the scale: smaller, and
           slightly off. ZeRO++ quantizes what it sends, not what it computes with.""",
           "quantize", "quantized", "quantizing", "dequantize", "dequantized"),
        _e("mixed precision", """the usual recipe: bf16 parameters and gradients for the passes, and
           an fp32 master copy of the parameters plus Adam's two moments for the update (12 bytes per
           parameter), so tiny updates are not rounded away.""", "mixed-precision"),
        _e("optimizer state", """what the [optimizer](#optimizer) keeps between steps. For Adam in
           mixed precision: an fp32 master copy of the parameters, the momentum and the variance,
           K = 12 bytes per parameter."""),
        _e("K", """bytes of [optimizer state](#optimizer-state) per parameter: 12 for Adam in mixed
           precision, 8 for Adam in plain fp32.""", case_sensitive=True),
        _e("model states", """[parameters](#parameter), [gradients](#gradient) and
           [optimizer state](#optimizer-state) together: (2 + 2 + K) bytes × Ψ in mixed precision,
           16Ψ bytes for Adam. The part of memory [ZeRO](#zero) shards.""", "model state"),
        _e("activation", """an intermediate result of the forward pass, saved because the backward pass
           needs it. Activations grow with micro-batch and sequence length and often take more memory than
           the model states; [activation checkpointing](#activation-checkpointing) trades them for
           compute.""", "activation memory"),
        _e("activation checkpointing", """keeping fewer activations and recomputing the rest during the
           backward pass (also *recompute*). The simulator's modes: `none` keeps everything;
           `selective` recomputes only the attention scores; `full` keeps each layer's input and
           redoes the layer's forward pass, the least memory for about a third more compute.""",
           "checkpointing", "gradient checkpointing", "recompute", "recomputation", "recomputing",
           "recomputed", "activation recompute"),
        _e("buffers", """the memory category for communication: flat [buckets](#bucket) of gradients,
           parameters [gathered](#all-gather) for one layer and freed after it, scratch space of
           collectives. Temporary, but it counts towards the peak (`buffers_GB`).""",
           "buffer", "communication buffer"),
        _e("HBM", """the GPU's own memory (high-bandwidth memory): 40 or 80 GB on an A100, 80 GB on an
           H100. Everything in this glossary's memory section lives in it."""),
        _e("capacity", """the GPU memory the simulator compares the [reserved memory](#reserved-memory)
           against (`capacity_GB`): what torch reports as the GPU's total memory. A scenario *fits*
           when its reserved memory is within it.""", "memory capacity"),
        _e("peak memory", """the most memory the step's tensors hold at any moment: model states,
           activations and buffers together (`peak_GB`, what `torch.cuda.max_memory_allocated`
           reports).""", "peak"),
        _e("reserved memory", """what the GPU must actually hold: the [peak memory](#peak-memory) of the
           tensors, plus what PyTorch's caching allocator keeps reserved beside them, plus the CUDA and
           NCCL context (`reserved_GB`). It is what *fits* compares with the
           [capacity](#capacity).""", "reserved"),
        _e("TFLOP/s", """10¹² floating-point operations per second, per GPU. *Useful* TFLOP/s (the
           simulator's `tflops_per_gpu`) counts the work the model needs, about
           6 × parameters × tokens per step (2 forward, 4 backward) plus attention, divided by the step
           time. *Hardware* TFLOP/s (`hardware_tflops_per_gpu`) also counts work done twice, such as a
           forward pass recomputed under [activation checkpointing](#activation-checkpointing), so it
           is higher for the same step. Published figures often quote hardware TFLOP/s.""",
           "TFLOP", "TFLOPS", "FLOP", "model FLOP", "hardware FLOP", anchor="tflops"),
        _e("MFU", """model FLOPs utilisation: the FLOPs the model needs per second (a causal mask's
           masked half of attention left out, which [TFLOP/s](#tflops) counts as papers do) over
           the GPU's peak (dense bf16). Well-tuned large-model training reaches 40-60%; no kernel
           family reaches 100%, so neither does MFU.""", "model FLOPs utilisation",
           case_sensitive=True),
    )),
    ("Strategies", "Ways of training one model on many GPUs, and the words they share.", (
        _e("rank", """one training process, numbered 0..N-1; on GPUs one rank per GPU, in CPU real runs
           one process. N is the number of ranks (the simulator's `gpus`)."""),
        _e("node", """one machine holding several GPUs (8 in a DGX or a p4d). Links inside a node
           (NVSwitch, PCIe) are much faster than the network between nodes.""",
           "inter-node", "intra-node"),
        _e("data parallelism", """every rank runs the same model on its own slice of the batch, then
           the ranks combine their gradients so that every copy takes the same update.""",
           "data-parallel", "data parallel"),
        _e("DDP", """PyTorch's DistributedDataParallel: data parallelism with everything replicated;
           gradients are [all-reduced](#all-reduce) in [buckets](#bucket) during the backward pass.""",
           "DistributedDataParallel"),
        _e("ZeRO", """the Zero Redundancy Optimizer: data parallelism that [shards](#shard) the optimizer
           state over the N ranks (ZeRO-1), also the gradients (ZeRO-2), also the parameters (ZeRO-3),
           so each rank keeps 1/N of them.""", "ZeRO-1", "ZeRO-2", "ZeRO-3", "Zero Redundancy Optimizer",
           case_sensitive=True),
        _e("FSDP", """PyTorch's Fully Sharded Data Parallel: the ZeRO-3 idea, one wrapped unit (here one
           layer) at a time.""", "Fully Sharded Data Parallel"),
        _e("DeepSpeed", """Microsoft's training library, where ZeRO was first implemented; its knobs
           (`stage3_prefetch_bucket_size` ...) appear in the zero3 strategy."""),
        _e("shard", """a rank's 1/N slice of a tensor. Sharded strategies keep only their shard between
           uses.""", "sharded", "sharding"),
        _e("reshard", """free the gathered full parameters again, keeping only the shard. FSDP's
           *reshard after forward* frees them after the forward pass and gathers them again for
           backward: less memory, one more [all-gather](#all-gather).""", "resharding", "resharded",
           "reshard-after-forward", "reshard after forward", "reshard_after_forward"),
        _e("hybrid sharding", """FSDP's *hybrid* mode (HSDP, the `hybrid` knob): [shard](#shard) within each
           [node](#node) and keep one copy per node, [all-reducing](#all-reduce) gradients across nodes. The
           slow network carries only the all-reduce; it needs at least two nodes.""", "HSDP",
           anchor="hybrid"),
        _e("limit_all_gathers", """FSDP1's rate limiter: at most two layers' gathered parameters in memory at
           once, so a [prefetch](#prefetch) waits instead of running ahead. Less memory, sometimes a
           slower step.""", anchor="limit-all-gathers"),
        _e("copy-in and copy-out", """FSDP's extra copies on the compute stream (the `copies` knob): FSDP1
           copies each gradient into one flat buffer; FSDP2 copies each gathered layer out into its
           parameters and each gradient into the reduce-scatter's input; `none` models neither.""",
           anchor="copies"),
        _e("per-unit update", """the `update` knob: FSDP updates its shards once every gradient has been
           reduced (`after_backward`, torch's FSDP), or each wrapped unit's shard as soon as its own
           [reduce-scatter](#reduce-scatter) lands (`per_unit`), overlapping the update with
           communication.""", anchor="update"),
        _e("root unit", """the layers no FSDP wrapped unit holds (embeddings, the final norm and head): the
           `root` knob keeps them as one flat parameter (`one`, torch's root unit) or one per layer
           (`per_layer`), each gathered and reduced on its own.""", anchor="root"),
        _e("prefetch", """start the [all-gather](#all-gather) of the next layer's parameters while this
           layer computes, so they are there when needed. Deeper prefetch hides more latency and holds
           more gathered parameters in memory.""", "prefetching", "prefetched"),
        _e("bucket", """a flat buffer into which several gradients are packed so that one collective
           moves them all. Buckets fill in the order backward produces gradients (last layer first);
           PyTorch DDP's default cap is 25 MiB, with a 1 MiB first bucket.""", "bucket cap"),
        _e("offload", """keep model states in the node's CPU memory instead of the GPU's. ZeRO-Offload moves
           the optimizer state there and runs the update on the CPU; ZeRO-3 and FSDP2 can move the
           weights too, copying each [shard](#shard) to the GPU before it is gathered. Less GPU memory,
           slower steps; see [offload.md](offload.md).""", "offloading", "offloaded", "CPU offload"),
        _e("ZeRO++", """three switches DeepSpeed adds to ZeRO-3 to send fewer bytes between
           [nodes](#node): [qwZ](#qwz), [hpZ](#hpz) and [qgZ](#qgz) (Wang et al. 2023). Each trades
           something (precision, memory, extra kernels) for network traffic.""", anchor="zeropp",
           case_sensitive=True),
        _e("qwZ", """ZeRO++'s quantized weights: every parameter [all-gather](#all-gather) moves int8
           instead of bf16, one byte an element plus a scale per block, and the receiver dequantizes
           (DeepSpeed's `zero_quantized_weights`).""", case_sensitive=True),
        _e("hpZ", """ZeRO++'s hierarchical partitioning: a second copy of the parameters sharded within
           each [node](#node), so that after a step's first forward the all-gathers run over NVLink
           only; costs 2Ψ / (GPUs per node) bytes a GPU (DeepSpeed's `zero_hpz_partition_size`).""",
           case_sensitive=True),
        _e("qgZ", """ZeRO++'s quantized gradients: the [reduce-scatter](#reduce-scatter) of gradients
           replaced by int4 [all-to-alls](#all-to-all), first inside each node, then across nodes, with
           the sums taken in full precision in between (DeepSpeed's `zero_quantized_gradients`).""",
           case_sensitive=True),
    )),
    ("Collectives", "The network operations every rank of a group calls together.", (
        _e("collective", """an operation every rank of a group calls together; it starts only when all
           of them have arrived."""),
        _e("all-reduce", """every rank contributes an array; every rank receives the element-wise sum
           (or mean) of all of them.""", "all_reduce", "allreduce", "all-reduced", "all-reducing"),
        _e("reduce-scatter", """every rank contributes an array and receives the sum of one 1/N chunk of
           it: rank r gets chunk r.""", "reduce_scatter", "reduce-scattered"),
        _e("all-gather", """every rank contributes its 1/N chunk and receives the whole array. A
           reduce-scatter followed by an all-gather is an all-reduce.""",
           "all_gather", "all-gathered", "gathered"),
        _e("broadcast", """one rank's buffer is copied to every other rank."""),
        _e("all-to-all", """every rank splits its array into N chunks and sends chunk j to rank j: each
           rank ends with one chunk from every rank. NCCL sends them all at once, peer to peer.""",
           "all_to_all", "alltoall"),
        _e("process group", """the set of ranks a collective runs over: `world` (all), `intra` (the ranks
           of one node), `inter` (one rank per node, same local index)."""),
        _e("ring", """the usual algorithm for large collectives: ranks pass chunks to their neighbour
           around a circle, so each rank sends about the buffer's size (all-reduce: twice) whatever N
           is."""),
        _e("latency", """the part of a collective's time that does not depend on its size: launch,
           handshakes, one hop per ring step. Small calls are all latency, large calls all
           bandwidth.""", "latencies"),
        _e("algbw / busbw", """nccl-tests' bandwidths for a collective of S bytes taking t seconds:
           algbw = S / t; busbw = algbw × a factor, 2(n-1)/n for all-reduce, (n-1)/n for
           reduce-scatter and all-gather, 1 for broadcast. busbw is comparable across n and with a
           link's speed.""", "algbw", "busbw", "bus bandwidth", "bus factor", anchor="busbw"),
        _e("NCCL", """NVIDIA's collective library for GPUs."""),
        _e("gloo", """PyTorch's collective library for CPUs, over TCP; the real runs use it."""),
        _e("nccl-tests", """NVIDIA's benchmarks for collectives (`all_reduce_perf` ...): a table of size,
           time, [algbw and busbw](#busbw) per message size.""", "all_reduce_perf"),
        _e("stream", """a first-in-first-out queue of work on a device: nothing on one stream overlaps.
           The simulator gives each rank a `compute` stream and one or more `comm` streams, fed by the
           [host](#host).""", "CUDA stream"),
        _e("host", """the Python thread of a rank, the `host` lane of a timeline: it issues work onto
           the streams and waits (grey) when the program must see a result. When it is slower than the
           GPU, the GPU idles.""", "host thread", "host lane", "host row", "host's"),
        _e("op", """one bar of a timeline: a compute kernel (`fwd L3`), a collective (`all_reduce B2`)
           or a wait, with its start and end."""),
        _e("kernel", """one function the GPU runs, such as a matrix multiplication; PyTorch launches
           kernels onto a [stream](#stream)."""),
        _e("overlap", """communication running while compute runs, so that it costs no step time; the
           share of communication time that overlaps compute.""", "overlapped", "overlapping"),
        _e("exposed communication", """time during which some collective runs and no compute does:
           communication nothing hid, which adds to step time (`exposed_comm`).""",
           "exposed comm", "exposed"),
        _e("straggler", """a rank that arrives late at a collective; everyone in the group waits for
           it."""),
    )),
    ("Hardware", "The machines and links the presets describe.", (
        _e("A100 / H100", """NVIDIA's data-centre GPUs: A100 (2020; 40 or 80 GB of HBM), H100 (2022;
           80 GB), H200 and B200 after them.""", "A100", "H100", "H200", "B200", anchor="a100"),
        _e("NVLink / NVSwitch", """NVIDIA's GPU-to-GPU links (NVLink) and the switch chips that join all
           GPUs of a node through them (NVSwitch), so any pair talks at full rate at once: hundreds of
           GB/s per GPU.""", "NVLink", "NVSwitch", "NVLS", anchor="nvswitch"),
        _e("PCIe", """the standard bus joining GPUs and network cards to the CPU: about 24 GB/s per GPU
           in practice (Gen4 x16). GPUs behind one PCIe switch share its bus, so adding GPUs there
           divides each one's share."""),
        _e("host bridge", """the link between the two CPU sockets of a server (and their PCIe trees).
           Traffic between GPUs attached to different sockets crosses it, slower than either bus
           (`nvidia-smi topo -m` shows such pairs as `SYS`).""", "host-bridge"),
        _e("InfiniBand", """the high-bandwidth, low-latency network of HPC and DGX clusters (HDR:
           200 Gbit/s per port, NDR: 400), with RDMA so transfers bypass the CPU."""),
        _e("EFA", """AWS's Elastic Fabric Adapter: the network between AWS GPU instances; on a p4d,
           400 Gbit/s per node, well below a DGX node's InfiniBand.""", "Elastic Fabric Adapter"),
        _e("p4d", """the AWS p4d.24xlarge instance: 8 A100 40 GB GPUs on NVSwitch, 4 × 100 Gbit/s of
           EFA (the `p4d-efa` topology preset).""", "p4d.24xlarge"),
        _e("topology", """the links between ranks (GPU ports, PCIe buses, host bridges, network cards)
           with their bandwidth and latency; a preset names one (`pcie`, `dgx-a100`, `p4d-efa`)."""),
    )),
    ("Models", "The model families the presets and sources name.", (
        _e("GPT-2", """OpenAI's 2019 family of text-generating models (124M to 1.5B parameters,
           sequences of 1,024 tokens); the usual small example."""),
        _e("RoBERTa", """Facebook AI's 2019 retraining of BERT, a model that reads text rather than
           generating it. The Amazon Science article trains 10B and 50B-parameter versions; the presets
           stand in for them with GPT-like blocks at sequence length 512."""),
    )),
    ("Tools of this project", "What the simulator and the real runs add.", (
        _e("trace", """a file listing every op with its start and end, to open in a viewer such as
           Perfetto (ui.perfetto.dev) or to read with Holistic Trace Analysis.""", "Perfetto"),
        _e("Holistic Trace Analysis", """Meta's library (HTA) for reading the PyTorch-profiler
           [traces](#trace) of a distributed job, one file per rank: where each rank's time went, and how
           much communication overlapped compute.""", "HTA", anchor="hta"),
        _e("calibration", """measured figures (collective latency and busbw, per-layer compute times,
           what communication costs compute on a CPU) that replace the simulator's analytical guesses;
           see [calibration.md](calibration.md)."""),
        _e("emulated cluster", """ranks on one Linux machine whose traffic crosses links throttled to a
           chosen rate by `tc`; see [emulated-cluster.md](emulated-cluster.md)."""),
        _e("software stack", """the software a run trains with, as one name (`--stack`): which attention
           kernel, whether norms and rotary embeddings are fused, FSDP1 or FSDP2, and how long Python
           takes to launch each kernel; see [stacks.md](stacks.md)."""),
        _e("host-bound", """a step whose GPU waits for the CPU: Python launches kernels more slowly than
           the GPU runs them (small models, small [micro-batches](#micro-batch), fast GPUs).""",
           "host bound"),
        _e("prediction interval", """the range in which the run is expected with 80% probability
           (`tokens_per_s_interval`): here propagated from the inputs' spreads through the simulated
           step ([uncertainty.md](uncertainty.md)).""",
           "likely range"),
    )),
)

ENTRIES: tuple[Entry, ...] = tuple(
    Entry(e.term, e.meaning, e.aliases, e.anchor, e.case_sensitive, title)
    for title, _, entries in SECTIONS for e in entries)


def _index() -> dict[str, Entry]:
    index: dict[str, Entry] = {}
    for e in ENTRIES:
        for key in (e.anchor, *e.names):
            index.setdefault(key if e.case_sensitive else key.lower(), e)
    return index


_INDEX = _index()


def entry(name: str) -> Entry:
    """The entry named ``name``: its anchor, its term or one of its aliases (case ignored; plural allowed)."""
    for key in (name, name[:-1] if name.endswith("s") else name, name[:-2] if name.endswith("es") else name):
        found = _INDEX.get(key) or _INDEX.get(key.lower())
        if found is not None and (not found.case_sensitive or key in (*found.names, found.anchor)):
            return found
    raise KeyError(f"{name!r} is not in the glossary ({PAGE}); its anchors: "
                   f"{', '.join(e.anchor for e in ENTRIES)}")


def _linked(meaning: str, base: str) -> str:
    """Relative links of a meaning made to work from elsewhere: ``(#x)`` -> ``(base#x)``."""
    folder = base.rpartition("/")[0]
    meaning = re.sub(r"\]\(#", f"]({base}#", meaning)
    return re.sub(r"\]\(([\w-]+\.md)\)", rf"]({folder}/\1)" if folder else r"](\1)", meaning)


def _row(e: Entry, base: str = "", anchor: bool = True) -> str:
    term = f"[{e.term}]({base}#{e.anchor})" if base else e.term
    target = f'<a id="{e.anchor}"></a>' if anchor else ""
    meaning = _linked(e.meaning, base) if base else e.meaning
    return f"| {target}**{term}** | {meaning} |"


def render() -> str:
    """The whole of ``docs/glossary.md``."""
    lines = [
        "# Glossary",
        "",
        "<!-- Generated by `python -m zero_sim.vocabulary.glossary > docs/glossary.md` from",
        "     zero_sim/vocabulary/glossary.py: edit that module, not this file. -->",
        "",
        "The terms used across the notebooks and these pages, for readers who know computers and",
        "networks but not ML training. Each row has a stable anchor: a notebook links it as",
        "`[bucket](../docs/glossary.md#bucket)`, or shows a few rows in place with",
        "`glossary(\"bucket\", \"all-reduce\")` (from `zero_sim.vocabulary.glossary`).",
        "",
        " · ".join(f"[{title}](#{slug(title)})" for title, _, _ in SECTIONS),
        "",
    ]
    for title, blurb, entries in SECTIONS:
        lines += [f"## {title}", "", blurb, "", "| term | meaning |", "| --- | --- |"]
        lines += [_row(e) for e in entries]
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True)
class Excerpt:
    """Some glossary entries as a markdown table; JupyterLab renders it when it ends a cell."""

    entries: tuple[Entry, ...]
    base: str = NOTEBOOK_LINK

    @property
    def markdown(self) -> str:
        rows = [_row(e, self.base, anchor=False) for e in self.entries]
        return "\n".join(["| term | meaning |", "| --- | --- |", *rows])

    def _repr_markdown_(self) -> str:
        return self.markdown

    def __str__(self) -> str:
        return self.markdown


def glossary(*terms: str, base: str = NOTEBOOK_LINK) -> Excerpt:
    """The entries for ``terms`` (anchors, terms or aliases), to show in a notebook.

    ``glossary("bucket", "all-reduce")`` as the last line of a code cell renders a table of
    the two entries, each term linked to its row of ``docs/glossary.md`` (``base`` is that
    page as seen from the notebook).  An unknown term raises ``KeyError`` naming the anchors.
    """
    if not terms:
        raise TypeError("glossary() needs at least one term, e.g. glossary(\"bucket\")")
    return Excerpt(tuple(entry(t) for t in terms), base)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ENTRIES", "Entry", "Excerpt", "NOTEBOOK_LINK", "PAGE", "SECTIONS", "entry", "glossary", "render",
           "slug"]
