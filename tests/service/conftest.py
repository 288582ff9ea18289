from tests.servers import service  # noqa: F401  (the shared live-service fixture)
