"""Forms of the incident page's on-call work: they check the shape of the input; the services decide."""

from django import forms

from jobs.models.incidents import IncidentCause
from jobs.services.incident_work import NOTE_MAX_CHARS


class AssignForm(forms.Form):
    user = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="Nobody",
        label="Assign to",
        help_text="Anyone who may see it.",
    )

    def __init__(self, *args, assignees, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["user"].queryset = assignees
        self.fields["user"].label_from_instance = lambda user: user.username


class NoteForm(forms.Form):
    body = forms.CharField(
        max_length=NOTE_MAX_CHARS,
        label="Note",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Markdown (links, lists, code); HTML is shown as text.",
    )


class ResolveForm(forms.Form):
    cause = forms.ChoiceField(choices=IncidentCause.choices, label="Cause", widget=forms.RadioSelect)
