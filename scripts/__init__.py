"""Project scripts. A package so that `python -m scripts.docker_engine` and the tests'
`from scripts import docker_engine` cannot pick up an unrelated installed `scripts` package."""
