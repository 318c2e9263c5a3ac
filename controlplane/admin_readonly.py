"""The admin's view of rows whose writes go through services: look, never add, change or delete.

A write by hand in the admin skips the service that guards it: no state machine, no audit entry, no event
(docs/security.md). Such models register with ``ReadOnlyAdmin``; their changes are made in the pages and the API.
"""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
