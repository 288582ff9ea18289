"""The public surfaces of litetopk.clients and litetopk.service are small and exactly these."""

import litetopk.clients
import litetopk.service


def test_clients_public_names():
    assert sorted(litetopk.clients.__all__) == sorted(
        [
            "AsyncTopKClient",
            "TopKClient",
            "Region",
            "RegionSlice",
            "TopKClientError",
            "TransportError",
            "ProtocolError",
            "ServiceProblem",
            "RegionProblem",
            "InvalidRequestProblem",
            "RowFaultProblem",
            "UnavailableProblem",
            "TimeoutProblem",
            "DeviceProblem",
            "AuthenticationProblem",
        ]
    )
    assert all(hasattr(litetopk.clients, name) for name in litetopk.clients.__all__)


def test_service_public_names():
    assert sorted(litetopk.service.__all__) == sorted(
        ["CODES", "ServiceError", "ServiceSettings", "__version__", "create_app"]
    )
    assert all(hasattr(litetopk.service, name) for name in litetopk.service.__all__)
