"""Testbed shapes (issue 54, item 6): a cluster file on testbed.yaml builds its own network, and the launcher refuses
a cluster file whose shape is not the one running."""
import json

import pytest

from launcher.settings import compose
from launcher.submit import running_shape
from tests.support import load_testbed as _testbed
from train.contract.common import SubmitError


@pytest.mark.parametrize("name", ["testbed_uneven", "testbed_holdout", "testbed_unseen"])
def test_a_shape_builds_what_the_launcher_reads(name):
    """testbed.py merges a shape's network on testbed.yaml's as Hydra merges the cluster file: both see one network."""
    built = _testbed().described(name)
    cluster = compose([f"cluster={name}"]).cluster
    assert {k: built[k] for k in ("subnet", "leaves", "spine", "node_link", "trunk")} == cluster.network
    assert sorted(n for m in built["leaves"].values() for n in m) == ["tb1", "tb2", "tb3", "tb4"]
    assert built != _testbed().described("testbed")


def test_a_cluster_file_of_another_shape_than_the_running_one_is_refused(tmp_path):
    state = tmp_path / "network.json"
    running = {**_testbed().described("testbed"), "cluster": "testbed"}
    state.write_text(json.dumps(running))
    running_shape(compose(["cluster=testbed"]).cluster, state)  # the same shape: accepted
    with pytest.raises(SubmitError, match=r"cluster 'testbed_uneven' describes another testbed shape than the one "
                                          r"running \(testbed: leaves=.*up --cluster testbed_uneven"):
        running_shape(compose(["cluster=testbed_uneven"]).cluster, state)
    running_shape(compose(["cluster=testbed_uneven"]).cluster, tmp_path / "absent.json")  # nothing recorded
