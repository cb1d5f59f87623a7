"""Old name of :mod:`medadapt.care`, kept only so model folders saved before the rename still open:
their ``modules.json`` names ``medadapt.asym.decoder.EosTransformer`` or
``medadapt.asym.truncate.MatryoshkaTruncate``. New code imports :mod:`medadapt.care`."""
