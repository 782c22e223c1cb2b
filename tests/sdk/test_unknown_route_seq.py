"""An unknown route called by a training client with a seq_id (issue 17, item 6):
the 404 does not leave a hole in the run's seq order, so the SDK's next op runs
at once instead of waiting --seq-timeout for a seq_id that never comes."""
from __future__ import annotations


from conftest import counting_datum, sdk_training_call, new_training_client, service_client
from test_bad_input import json_error, request


def test_unknown_route_does_not_stall_the_run(start_server):
    srv = start_server("--seq-timeout", "3600")  # a stall would outlast the result timeout below
    sc = service_client(srv.base_url, "tml-seq")
    tc = new_training_client(sc, rank=4, seed=5)
    tc.forward_backward([counting_datum(0)], "cross_entropy").result(timeout=60)
    for route in ("no_such_training_op", "save_weights_someday"):
        status, ctype, data, seq = sdk_training_call(tc, srv.port, route, {"path": "x"}, "tml-seq")
        msg = json_error(status, ctype, data, 404)
        assert route in msg, msg
    # sent twice (an SDK retry): still nothing consumed beyond the slot
    status, _, _ = request(srv.port, "POST", "/api/v1/no_such_training_op",
                           {"model_id": tc.model_id, "seq_id": seq}, key="tml-seq")
    assert status == 404
    out = tc.forward_backward([counting_datum(3)], "cross_entropy").result(timeout=60)
    assert out.metrics["loss:sum"] > 0
    # another tenant naming this run gets its 404 and cannot fill (or skip) its seq_ids
    status, _, _ = request(srv.port, "POST", "/api/v1/no_such_training_op",
                           {"model_id": tc.model_id, "seq_id": tc._request_id_counter + 6}, key="tml-other")
    assert status == 404
    tc.optim_step(__import__("conftest").adam()).result(timeout=60)
