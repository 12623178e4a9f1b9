"""The evaluator (``python -m eval``) and its scripts (``python -m eval.<script>``)."""

from zoomr.startup import quiet_if_running_a_script

quiet_if_running_a_script(__name__)  # python -m eval.<script>: Ctrl-C while its imports run prints one line
