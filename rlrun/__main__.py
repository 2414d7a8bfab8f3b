from rlrun.app.cli import main

if __name__ == "__main__":  # guard: spawned child processes import this module too
    main()
