#include "ui/utility/error_text.h"

#include <QObject>
#include <QUnhandledException>
#include <exception>

namespace tessera::ui {

QString error_text(const Error& error) {
  QString text = QString::fromStdString(error.what());
  if (!error.hint().empty()) text += "\n" + QString::fromStdString(error.hint());
  return text;
}

QString current_exception_text() {
  std::exception_ptr error = std::current_exception();
  try {
    throw;
  } catch (const QUnhandledException& e) {
    if (e.exception()) error = e.exception();
  } catch (...) {
  }
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return error_text(e);
  } catch (const std::exception& e) {
    return QString::fromUtf8(e.what());
  } catch (...) {
  }
  return QObject::tr("an unknown error");
}

}  // namespace tessera::ui
