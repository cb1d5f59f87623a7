"""Old home of the heads, kept only so model folders saved before the move still open: their ``modules.json``
names ``medadapt.heads.moe.MoEHead`` or ``medadapt.heads.linear.LinearHead`` / ``SearchAdaptorHead``. New code
imports :mod:`medadapt.moe` (Med-MoE-Embed, KAN layers) and :mod:`medadapt.adapters` (``attach``,
``find_head``, the linear heads)."""
