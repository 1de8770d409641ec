#pragma once
// Chart widgets over Qt Charts: line charts that grow as points arrive (axes follow the
// data), a per-tier memory chart stacked by what holds the memory, and the disk tier's chunk
// traffic. Series colours are
// fixed (so two runs compare the same way everywhere); everything else follows the palette.
#include <QChartView>
#include <QHash>
#include <QList>
#include <QPointF>
#include <QString>

class QLineSeries;
class QValueAxis;
class QLogValueAxis;
class QAreaSeries;

namespace tessera::ui {

struct MemorySample;

// Colours picked for contrast on both light and dark backgrounds.
QColor series_color(int index);

// Applies the widget palette to a chart (background, text, grid).
void apply_palette(QChart* chart, const QPalette& palette);

// Bytes in binary units with three significant digits: "512 B", "1.50 KiB", "159 MiB".
QString format_bytes(double bytes);

class LineChart : public QChartView {
  Q_OBJECT
 public:
  LineChart(const QString& title, const QString& x_label, const QString& y_label,
            QWidget* parent = nullptr);
  // Adds points to the named series (created on first use, in call order).
  void append(const QString& series, const QList<QPointF>& points);
  void clear();
  int point_count(const QString& series) const;
  int series_count() const { return int(series_.size()); }
  void set_empty_text(const QString& text);  // shown in the title while there is no point

 protected:
  void changeEvent(QEvent* event) override;

 private:
  void update_title();
  QString title_, empty_text_;
  QHash<QString, QLineSeries*> series_;
  QValueAxis* x_axis_;
  QValueAxis* y_axis_;
  double x_min_ = 0, x_max_ = 0, y_min_ = 0, y_max_ = 0;
  bool has_points_ = false;
};

// One memory tier over time, stacked by category (weights, gradients, optimizer state,
// activations and other), with the tier's budget as a dashed line when reported, the machine's
// memory in use (host) and the plan's estimated peak as lines. A category or line is listed in
// the legend (and drawn) once it has held something, and stays listed: the legend only grows,
// in a fixed order.
class MemoryChart : public QChartView {
  Q_OBJECT
 public:
  MemoryChart(const QString& tier, QWidget* parent = nullptr);
  void append(const QList<MemorySample>& samples, double t0);
  int point_count() const;
  int system_point_count() const;
  // Bytes of `category` (memory_categories()) in the latest sample drawn; kMissing: none.
  double last_bytes(int category) const;
  bool category_shown(int category) const;  // drawn and listed in the legend
  // The plan's estimated peak of this tier, drawn across the chart (0: none).
  void set_estimate(double bytes);
  double estimate() const { return estimate_bytes_; }
  void clear();

 protected:
  void changeEvent(QEvent* event) override;

 private:
  QString tier_;
  QList<QLineSeries*> uppers_;  // cumulative, one per category
  QList<QAreaSeries*> areas_;
  QLineSeries* budget_;
  QLineSeries* system_;
  QLineSeries* estimate_;
  QValueAxis* x_axis_;
  QValueAxis* y_axis_;
  double x_max_ = 0, y_max_ = 0;
  double estimate_bytes_ = 0;
  bool shown_[4] = {false, false, false, false};  // categories that have held something
  void draw_estimate();
  void add_line(QLineSeries* series, const QString& name, int color, Qt::PenStyle style);
};

// The disk tier's chunk traffic over time: bytes per second read from disk into host memory
// and written from host memory to disk, on an axis in binary units (B/s … GiB/s) that follows
// the largest rate.
class TrafficChart : public QChartView {
  Q_OBJECT
 public:
  enum class Direction { DiskToHost, HostToDisk };
  explicit TrafficChart(QWidget* parent = nullptr);
  // Takes the rates of the disk-tier samples that report traffic.
  void append(const QList<MemorySample>& samples, double t0);
  int point_count() const;
  double last_rate(Direction direction) const;  // bytes/s of the latest point; kMissing: none
  QString unit() const;                         // of the y axis: "MiB/s", …
  void clear();

 protected:
  void changeEvent(QEvent* event) override;

 private:
  void set_unit(double bytes_per_unit);
  QLineSeries* read_;
  QLineSeries* written_;
  QValueAxis* x_axis_;
  QValueAxis* y_axis_;
  double x_max_ = 0, y_max_bytes_ = 0;  // y in bytes/s
  double bytes_per_unit_ = 1;           // a power of 1024: scaling is exact
};

}  // namespace tessera::ui
