#include "ui/widgets/card_view.h"

#include <QDesktopServices>

namespace tessera::ui {

CardView::CardView(QWidget* parent) : QTextBrowser(parent) {
  setAccessibleName(tr("Repository card"));
  // Navigation inside the view would replace the card with a file it cannot load: every link is
  // handled here instead.
  setOpenLinks(false);
  setOpenExternalLinks(false);
  connect(this, &QTextBrowser::anchorClicked, this, [this](const QUrl& link) {
    if (link.isRelative() && link.path().isEmpty() && link.hasFragment()) {
      scrollToAnchor(link.fragment());
      return;
    }
    const QUrl target = link_target(link);
    if (!target.isValid()) return;
    QDesktopServices::openUrl(target);
    Q_EMIT linkOpened(target);
  });
}

void CardView::show_card(const QUrl& repo_page, const QString& markdown) {
  repo_page_ = repo_page;
  setMarkdown(markdown);
}

void CardView::show_note(const QString& text) {
  repo_page_ = QUrl();
  setPlainText(text);
}

QUrl CardView::link_target(const QUrl& link) const {
  if (!link.isRelative() || !repo_page_.isValid()) return link;
  // Relative to the card's folder: the repository's files at main, as the Hub's page resolves.
  QUrl base = repo_page_;
  base.setPath(base.path() + "/blob/main/");
  return base.resolved(link);
}

}  // namespace tessera::ui
