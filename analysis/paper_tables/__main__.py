from analysis.paper_tables import main
from zoomr.script import run_script

run_script(main)
