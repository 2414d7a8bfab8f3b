from rlrun.cli import main

main()
