from evolve.cli import main

if __name__ == "__main__":       # python -m evolve (importing this module runs nothing)
    main()
