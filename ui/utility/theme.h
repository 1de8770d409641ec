#pragma once
// The studio's theme (Settings → Theme): the platform's own look, or Fusion with a light or a
// dark palette. Qt 6.4 has no QStyleHints::setColorScheme, so the palette is set on the
// application; every widget (the charts included) follows its PaletteChange.
#include <QPalette>
#include <QString>

namespace tessera::ui {

// "system" | "light" | "dark" (anything else reads as "system"). The first call remembers the
// platform's style and palette, so "system" can return to them later.
void apply_theme(const QString& theme);
QPalette dark_palette();

}  // namespace tessera::ui
