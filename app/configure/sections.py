"""The Configure screen's sections: the side panel's list (wide terminals), Ctrl+G and
Ctrl+Up/Down to go from one to the next. Mixed into ConfigureScreen."""
from __future__ import annotations

from textual.widgets import Static

from .fields import BY_PATH, GROUPS
from .controls import group_id, show


class SectionNavigation:
    """Where the focus is among the form's sections, and how to get to another."""

    def sections(self) -> list[tuple[str, bool, int]]:
        """(section, has something to show, problems in it), in form order."""
        count = {g: 0 for g in GROUPS}
        for path in self.problems:
            if path in BY_PATH:
                count[BY_PATH[path].group] += 1
        return [(g, self.form.group_shown(g), count[g]) for g in GROUPS]

    def _update_sections(self) -> None:
        """The side panel's section list: numbers (Ctrl+G, then the digit), problems, where focus is."""
        if not self.query_one("#side").display:
            return  # narrow: not shown (on_resize fills it when it appears)
        here = self.form.group_of(self.focused) if self.focused else None
        lines = ["[b]Sections[/b] [dim]^g, ctrl+↑↓[/dim]"]
        for i, (group, shown, bad) in enumerate(self.sections(), 1):
            mark = f"  [b $error]✗ {bad} problem{'s' if bad > 1 else ''}[/]" if bad else ""
            text = f"{i} {group}{mark}"
            if group == here:
                text = f"[reverse]{text}[/reverse]"
            elif not shown:
                text = f"[dim]{text} –[/dim]"
            lines.append(" " + text)
        show(self.query_one("#sections", Static), "\n".join(lines))

    def on_resize(self, event) -> None:
        """Wide: sections and summary at the side. A class on the screen (Textual breakpoints)
        would restyle every widget of the form on the first frame; two displays do not."""
        wide = event.size.width >= self.WIDE
        self.query_one("#side").display = wide
        self.query_one("#summary").display = not wide
        self._update_sections()

    def on_descendant_focus(self, event) -> None:
        self._update_sections()

    def action_sections(self) -> None:
        from .dialogs import SectionsDialog

        here = self.form.group_of(self.focused) if self.focused else None
        self.app.push_screen(SectionsDialog(self.sections(), here),
                             lambda group: self.go_to_section(group) if group else None)

    def action_section(self, step: int) -> None:
        """Ctrl+Down / Ctrl+Up: the next / previous section that has something to show."""
        shown = [i for i, (_, ok, _) in enumerate(self.sections()) if ok]
        if not shown:
            return
        here = self.form.group_of(self.focused) if self.focused else None
        at = GROUPS.index(here) if here in GROUPS else -1
        if step > 0:
            target = next((i for i in shown if i > at), shown[0])
        else:
            target = next((i for i in reversed(shown) if i < at), shown[-1])
        self.go_to_section(GROUPS[target])

    def go_to_section(self, group: str, tries: int = 0) -> None:
        """Focus a section's first field with its title in view."""
        if group not in self.form.mounted_groups:  # mounted after the first frame
            if tries < 200:
                self.set_timer(0.05, lambda: self.go_to_section(group, tries + 1))
            return
        w = self.form.first_control(group)
        if w is None:
            return
        w.focus(scroll_visible=False)
        self._title_to_top(group, w)

    def _title_to_top(self, group: str, field, tries: int = 0) -> None:
        """Until the groups after it are mounted the form may be too short for this title to reach
        the top: scroll again as they come, while the user is still in that section."""
        title = self.form.w(group_id(group) + "-title")
        self.form.scroll_to_widget(title, top=True, animate=False)
        if self.focused is not field:
            return
        if not self.form.complete and tries < 100:
            self.set_timer(0.05, lambda: self._title_to_top(group, field, tries + 1))
        elif tries:  # the last group was mounted, maybe not laid out yet
            self.call_after_refresh(lambda: self.form.scroll_to_widget(title, top=True, animate=False))
