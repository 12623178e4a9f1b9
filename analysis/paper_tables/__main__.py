from analysis.paper_tables import main

main()
