#pragma once
// A Hub repository's card (README.md) rendered as Markdown. Links open outside the studio, in the
// system's browser: absolute ones as they are, relative ones ("LICENSE", "docs/usage.md") against
// the repository's files on the Hub; "#anchor" links scroll within the card.
#include <QTextBrowser>
#include <QUrl>

namespace tessera::ui {

class CardView : public QTextBrowser {
  Q_OBJECT
 public:
  explicit CardView(QWidget* parent = nullptr);

  // `markdown` (front matter already dropped) of the repository whose page is `repo_page`
  // ("https://huggingface.co/org/name" or ".../datasets/org/name").
  void show_card(const QUrl& repo_page, const QString& markdown);
  void show_note(const QString& text);  // "Loading the card…", in place of a card
  // Where a click on `link` goes (what show_card's links open).
  QUrl link_target(const QUrl& link) const;

 Q_SIGNALS:
  void linkOpened(const QUrl& url);

 private:
  QUrl repo_page_;
};

}  // namespace tessera::ui
