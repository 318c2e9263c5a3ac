"""The one scoping mechanism (tenancy.scoping) and the one way to refuse (controlplane.access.require)."""

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db.models import Q

from controlplane.access import Refused, principal, require
from controlplane.errors import ServiceError
from tenancy.models import Tenant
from tenancy.scoping import may_see, restrict, scope_condition, sees


def names(rows) -> list[str]:
    return sorted(rows.values_list("name", flat=True))


def test_restrict_sees_all_for_providers_own_for_tenants_nothing_for_anonymous(users):
    assert names(restrict(Tenant.objects.all(), users["operator"])) == ["Acme", "Globex"]
    assert names(restrict(Tenant.objects.all(), users["tenant-viewer"])) == ["Acme"]
    assert names(restrict(Tenant.objects.all(), principal(users["other-admin"]))) == ["Globex"]
    assert names(restrict(Tenant.objects.all(), AnonymousUser())) == []
    assert scope_condition(Tenant, users["provider-admin"]) is None


def test_scope_replaces_and_also_adds_what_a_tenant_sees(users):
    viewer = users["tenant-viewer"]
    assert names(restrict(Tenant.objects.all(), viewer, also=Q(name="Globex"))) == ["Acme", "Globex"]
    assert names(restrict(Tenant.objects.all(), viewer, scope=Q(name="Globex"))) == ["Globex"]
    operator = users["operator"]
    assert names(restrict(Tenant.objects.all(), operator, scope=Q(name="Globex"))) == ["Acme", "Globex"]


def test_may_see_and_sees_answer_for_one_row(users, tenant_a, tenant_b):
    viewer = principal(users["tenant-viewer"])
    assert may_see(viewer, Tenant, tenant_a.pk) and not may_see(viewer, Tenant, tenant_b.pk)
    assert may_see(principal(users["operator"]), Tenant, 10**9)  # providers: any key, even one not there yet
    assert sees(users["tenant-viewer"], tenant_a) and not sees(users["tenant-viewer"], tenant_b)
    assert not sees(AnonymousUser(), tenant_a)


def test_a_refusal_is_a_403_to_pages_the_api_and_services_alike():
    require(True, "never raised")
    with pytest.raises(Refused) as refused:
        require(False, "only provider roles", field="mode")
    assert isinstance(refused.value, PermissionDenied) and isinstance(refused.value, ServiceError)
    assert refused.value.status == 403
    assert refused.value.as_response_data() == {"mode": ["only provider roles"]}
    assert str(refused.value) == "only provider roles"
