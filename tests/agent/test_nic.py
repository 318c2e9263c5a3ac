"""The sysfs NIC collector, over a fake sysfs tree in tmp_path."""

from lockstep_agent.batch import make_batch
from lockstep_agent.nic import NICCollector


def by_name(nics):
    return {nic["name"]: nic for nic in nics}


def test_reads_link_state_and_counters(sysfs, batch_validator):
    nics = by_name(NICCollector(sysfs).collect())

    assert sorted(nics) == ["eth0", "eth1", "ib0", "mlx5_1:1"]  # lo is virtual: left out
    eth0 = nics["eth0"]
    assert eth0["kind"] == "ethernet"
    assert eth0["link_state"] == "up"
    assert eth0["speed_bps"] == 100_000_000_000
    assert eth0["fields"]["carrier_changes"] == 4
    assert eth0["fields"]["carrier_down_count"] == 2
    assert eth0["fields"]["rx_crc_errors"] == 7

    batch_validator.validate(make_batch(node="gpu-001", gpu_status="no_nvml", nics=list(nics.values())))


def test_an_ib_port_with_a_netdev_is_one_nic_with_both_counter_sets(sysfs):
    ib0 = by_name(NICCollector(sysfs).collect())["ib0"]
    assert ib0["kind"] == "infiniband"
    assert ib0["ib_device"] == "mlx5_0"
    assert ib0["ib_port"] == 1
    assert ib0["ib_state"] == "ACTIVE"
    assert ib0["ib_phys_state"] == "LinkUp"
    assert ib0["link_state"] == "up"
    assert ib0["speed_bps"] == 400_000_000_000
    assert ib0["fields"]["carrier_changes"] == 9
    assert ib0["fields"]["symbol_error"] == 12
    assert ib0["fields"]["link_downed"] == 3
    assert ib0["fields"]["port_rcv_errors"] == 5


def test_an_ib_port_without_a_netdev_and_a_down_link(sysfs):
    nics = by_name(NICCollector(sysfs).collect())
    port = nics["mlx5_1:1"]
    assert port["link_state"] == "down"
    assert port["ib_state"] == "DOWN"
    assert port["fields"]["link_downed"] == 255
    assert "netdev" not in port

    # An administratively down interface: sysfs refuses carrier and speed (EINVAL); we report down.
    eth1 = nics["eth1"]
    assert eth1["link_state"] == "down"
    assert "carrier" not in eth1["fields"]
    assert "speed_bps" not in eth1


def test_a_link_flap_moves_the_counters(sysfs):
    collector = NICCollector(sysfs)
    before = by_name(collector.collect())["ib0"]
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")
    (port / "counters/link_downed").write_text("4\n")
    during = by_name(collector.collect())["ib0"]
    assert before["link_state"] == "up"
    assert during["link_state"] == "down"  # the port's state wins over the IPoIB netdev's "up"
    assert during["fields"]["link_downed"] == before["fields"]["link_downed"] + 1


def test_virtual_interfaces_on_request_and_no_sysfs_at_all(sysfs, tmp_path):
    names = {nic["name"] for nic in NICCollector(sysfs, include_virtual=True).collect()}
    assert "lo" in names
    assert NICCollector(tmp_path / "nowhere").collect() == []
