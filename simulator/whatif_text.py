"""The what-if report as text for `manage.py simulate what-if`."""


def format_report(report: dict) -> str:
    """The report as lines for the command line: today's effective-training-time lines first, then the checkpoint
    advice, the sensitivity table and the assumptions."""
    c, u, p = report["config"], report["unprotected"], report["protected"]
    lines = [
        f"What-if: {c['gpus']:,} GPUs for {c['days']:g} days, profile {report['profile']['name']} "
        f"({report['profile']['source']}), seed {c['seed']}; checkpoint every {c['checkpoint_minutes']:g} min, "
        f"restart overhead {c['restart_overhead_minutes']:g} min",
        f"interruptions: {u['interruptions']} (one every {report['profile']['mean_hours_between_interruptions']} h expected)",
        f"{'':32s}{'without protection':>20s}{'with Lockstep':>16s}",
    ]
    for label, key, fmt in [
        ("effective training time", "effective_training_time", "{:.1%}"),
        ("unplanned downtime (h)", "unplanned_downtime_hours", "{:.1f}"),
        ("work redone (h)", "work_redone_hours", "{:.1f}"),
        ("checkpoint writes (h)", "checkpoint_write_hours", "{:.1f}"),
        ("GPU-hours lost", "gpu_hours_lost", "{:,.0f}"),
        ("GPU-hours saved vs restart", "gpu_hours_saved", "{:,.0f}"),
        ("interruptions losing no progress", "share_no_progress_lost", "{:.1%}"),
    ]:
        lines.append(f"{label:32s}{fmt.format(u[key]):>20s}{fmt.format(p[key]):>16s}")
    if "unplanned_downtime_reduction" in report:
        lines.append(f"unplanned downtime {report['unplanned_downtime_reduction']:.0%} lower with Lockstep")
    lines.append(f"actions without protection: {u['actions']}")
    lines.append(f"actions with Lockstep:      {p['actions']}")
    lines.append(
        f"with Lockstep: {p['failed_recoveries']} failed recoveries fell back, {p['spares_exhausted']} waits for "
        f"a spare, correlated {p['correlated_failures'] or 'none'}, "
        f"{p['hardware_faults_on_lemon_nodes']:.0%} of hardware faults on lemon nodes, "
        f"{p['lemons_retired']} lemons retired"
    )
    top = ", ".join(f"{k} {v}" for k, v in list(p["faults_by_root_cause"].items())[:6])
    lines.append(f"faults by root cause: {top}, …")
    lines.append(
        f"published: Llama 3 effective training time {report['published']['llama3_effective_training_time']}"
    )
    real = report.get("real_path")
    if real:
        lines += _real_path_lines(real)
    advice = report.get("checkpoint_advice")
    if advice:
        for key, label in (("unprotected", "without protection"), ("protected", "with Lockstep")):
            a = advice[key]
            lines.append(
                f"checkpoint every {a['daly_minutes']:.0f} min (Young/Daly) {label}: one restart every "
                f"{a['mtbf_hours']:.1f} h, {advice['checkpoint_write_seconds']:g} s a checkpoint; effective "
                f"training time {a['effective_training_time_replayed_at_daly']:.1%} replayed "
                f"({a['effective_training_time_at_daly']:.1%} closed form; Young {a['young_minutes']:.0f} min)"
            )
    if report.get("sensitivity"):
        lines.append("sensitivity (effective training time; same fault trace, one assumption moved):")
        lines.append(
            f"  {'assumption':42s}{'value':>10s}{'pessimistic':>14s}{'protected':>11s}{'unprot.':>9s}"
            f"{'optimistic':>12s}{'protected':>11s}{'unprot.':>9s}"
        )
        for row in report["sensitivity"]:
            pess, opt = row["pessimistic"], row["optimistic"]
            lines.append(
                f"  {row['assumption']:42s}{row['value']:>10g}{pess['value']:>14g}{pess['protected']:>11.1%}"
                f"{pess['unprotected']:>9.1%}{opt['value']:>12g}{opt['protected']:>11.1%}{opt['unprotected']:>9.1%}"
            )
    if report.get("assumptions"):
        lines.append("assumptions:")
        for item in report["assumptions"]:
            unit = f" {item['unit']}" if item["unit"] else ""
            lines.append(f"  {item['name']}: {item['value']}{unit} — {item['source']}")
    return "\n".join(lines)


def _real_path_lines(real: dict) -> list[str]:
    """The real-path replay's lines (``--real-path``): what Lockstep's own services did with the same faults."""
    if "not_replayed" in real:
        return [f"not replayed through Lockstep's own services: {real['not_replayed']}"]
    timing = real["timing"]
    return [
        f"through Lockstep's own services (scratch store, {timing['replay_seconds']:.0f} s, "
        f"{timing['ms_per_interruption']:.0f} ms an interruption): effective training time "
        f"{real['effective_training_time']:.1%} with Lockstep",
        f"  {real['replayed']} of {real['interruptions']} interruptions decided, recoveries {real['recoveries']}; "
        f"job {real['job_state'].lower()} at the end; {real['nodes_repaired']} nodes repaired and back, "
        f"{real['links_failed_back']} links failed back",
        f"  recovering {real['recovering_hours']:.1f} h, work redone {real['work_redone_hours']:.1f} h, degraded "
        f"{real['degraded_hours']:.1f} h, checkpoint writes {real['checkpoint_write_hours']:.1f} h; "
        f"GPU-hours lost {real['gpu_hours_lost']:,.0f} (restart baseline {real['gpu_hours_baseline']:,.0f})",
        f"  actions: {real['actions']}",
        f"  not modelled yet: {', '.join(real['not_modelled'])}",
        *_real_path_sensitivity_lines(real.get("sensitivity") or []),
    ]


def _real_path_sensitivity_lines(rows: list[dict]) -> list[str]:
    """The real path's sensitivity rows: its protected figure with one assumption moved, and how it was got."""
    if not rows:
        return []
    lines = [
        "  sensitivity through the real path (effective training time with Lockstep; re-costed: the recorded "
        "decisions booked at the row's price; replayed: a whole replay at the row's value):",
        f"    {'assumption':42s}{'value':>10s}{'pessimistic':>14s}{'':>8s}{'optimistic':>12s}{'':>8s}  how",
    ]
    for row in rows:
        pess, opt = row["pessimistic"], row["optimistic"]
        lines.append(
            f"    {row['assumption']:42s}{row['value']:>10g}{pess['value']:>14g}{pess['protected']:>8.1%}"
            f"{opt['value']:>12g}{opt['protected']:>8.1%}  {row['how']}"
        )
    if not any(row["how"] == "replayed" for row in rows):
        lines.append("    (the capacity rows replay the whole run again each: --real-path-sensitivity)")
    return lines
