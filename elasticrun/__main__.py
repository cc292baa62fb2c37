from elasticrun.cli import main

main()
