"""Data-path rules that both backends apply the same way, as pure functions: the copy path
and CTA count (``copypath``), the disk-I/O piece order (``diskio``), the host-fill
layout (``fill``), what a step computes and the shape of its stand-in (``work``) and how
copies slow it (``interference``). The core's bookkeeping never imports them; the
backends and the engine do. Pure like the rest of ``kvsim.core``."""
