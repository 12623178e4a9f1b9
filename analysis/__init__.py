"""Analyses, benchmarks, tables and figures (``python -m analysis +task=…`` or ``python -m analysis.<script>``)."""

from zoomr.startup import quiet_if_running_a_script

quiet_if_running_a_script(__name__)  # python -m analysis.<script>: Ctrl-C while its imports run prints one line
