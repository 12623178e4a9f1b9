"""Data preparation (``python -m data_prep +pipeline=…``) and its scripts (``python -m data_prep.<script>``)."""

from zoomr.startup import quiet_if_running_a_script

quiet_if_running_a_script(__name__)  # python -m data_prep.<script>: Ctrl-C while its imports run prints one line
