"""The HTTP drop-in (``verifier serve --http-port N``): SandboxFusion's ``POST /run_code``,
OpenRLHF's ``/get_reward`` and ``/score``, over the same Scorer as gRPC."""
