"""axe-core in a real browser page (axe-playwright-python bundles it): what it finds serious or critical."""


def axe_serious(page, within: str | None = None) -> list[str]:
    """One line per serious or critical violation (rule, help, first element), on the page or within a part of
    it (a CSS selector)."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page, context=within).response
    return [
        f"{found['id']}: {found['help']} {found['nodes'][0]['target']}"
        for found in results["violations"]
        if found["impact"] in {"critical", "serious"}
    ]
